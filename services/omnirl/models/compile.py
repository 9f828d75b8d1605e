"""Regional `torch.compile` of a denoiser: each repeated transformer block is compiled in place.

Why regional: a DiT is N copies of a few block variants, so compiling the block (not the whole
model) compiles each variant once — tens of seconds instead of minutes — and the code around the
blocks (embedders, final layer) stays eager and cheap. Why `dynamic=True`: the step-wise engine
changes the batch size every step and serves several resolutions; with symbolic sizes one graph
per block variant serves them all, so steady state never recompiles (only sizes 0 and 1 are
specialised by dynamo, one extra graph). Same idea as diffusers' `compile_repeated_blocks`,
which needs a `_repeated_blocks` class attribute that SD3's transformer lacks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

RECOMPILE_LIMIT = 64
"""Graphs kept per block code object: block variants × (train, no-grad, adapters off) × size-1."""

INDUCTOR_OPTIONS = {"coordinate_descent_tuning": True}
"""Inductor options of every compiled block. Coordinate-descent tuning of the Triton kernels
(norms with modulation, GELU, RMSNorm — the memory-bound rest around cuBLAS's GEMMs) took the
SD3.5-Medium-sized rollout engine from 18.56 to 19.11 images/s on an H200 (57.0 → 58.7% MFU;
`benchmarks/README.md`, key `inductor_probe`). Like Inductor's default autotuning it tunes each
kernel once, at the first shape it runs; GEMMs stay cuBLAS, so matrix products are unchanged."""


def compile_kwargs(*, dynamic: bool = True, mode: str | None = None) -> dict:
    """`torch.compile` keyword arguments: `dynamic`, and `mode` when given, else `INDUCTOR_OPTIONS`
    (torch.compile refuses both at once; a named mode brings its own options)."""
    return {"dynamic": dynamic, "mode": mode} if mode is not None else {"dynamic": dynamic, "options": INDUCTOR_OPTIONS}


def block_types(module: nn.Module, declared: Sequence[str] | None = None) -> list[str]:
    """Class names of the repeated blocks: the adapter's `compile_block_types`, else diffusers'
    `_repeated_blocks`. Raises ValueError when neither names any."""
    names = list(declared or getattr(module, "_repeated_blocks", None) or [])
    if not names:
        raise ValueError(f"{type(module).__name__} declares no repeated block types to compile; set the adapter's "
                         "compile_block_types")
    return names


def compile_blocks(module: nn.Module, names: Sequence[str], *, dynamic: bool = True, mode: str | None = None) -> int:
    """`torch.compile` every submodule whose class, or a base class, is named in `names`, in place;
    returns how many (an FSDP2-sharded block is its class's subclass `FSDP<Name>`).

    Compile after LoRA injection (peft replaces Linear children) and after any module copies.
    Parameters updated in place later (weight sync, optimiser steps) need no recompile.
    Raises:
        ValueError: no submodule matches `names`.
    """
    for key in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, key):
            setattr(torch._dynamo.config, key, max(getattr(torch._dynamo.config, key), RECOMPILE_LIMIT))
    wanted = set(names)
    # by the class or a base: FSDP2's fully_shard swaps a block's class for a subclass `FSDP<Name>` (the
    # actor compiles after sharding), which matched no name and stopped every actor rank at start
    blocks = [m for m in module.modules() if any(c.__name__ in wanted for c in type(m).__mro__)]
    if not blocks:
        raise ValueError(f"no submodule of {type(module).__name__} has a class in {sorted(wanted)}; nothing to compile")
    for block in blocks:
        block.compile(**compile_kwargs(dynamic=dynamic, mode=mode))
    return len(blocks)


def compile_adapter_module(adapter, *, dynamic: bool = True, mode: str | None = None) -> int:
    """`compile_blocks` on `adapter.module` with the adapter's declared block types, and the
    adapter's packed (mixed-shape) forward when it has one (`compile_packed`)."""
    names = block_types(adapter.module, getattr(adapter, "compile_block_types", None))
    count = compile_blocks(adapter.module, names, dynamic=dynamic, mode=mode)
    if hasattr(adapter, "compile_packed"):
        adapter.compile_packed(dynamic=dynamic, mode=mode)
    return count


def while_compiling(start: Callable[[], Callable[[], None]]) -> Callable[[], None]:
    """Run `start()` whenever torch.compile begins compiling in this process, and the function it
    returned when that compilation ends; returns the function that unregisters both.

    A compilation is dynamo tracing a new frame (the first call, a recompile for a new shape or
    grad mode) with its inductor codegen, or a backward compiled lazily at its first use: the
    warm-up of a compiled step, tens of seconds to minutes, inside one call the role's loop cannot
    beat from. The roles pass `Heartbeat.start_covering` bound by
    `failurePolicy.startupDeadlineSeconds`, so a compile counts as progress for at most that long.
    Nested compilations (dynamo counts them) call `start` once. `torch._dynamo.reset()` drops the
    callbacks (register again after it).
    """
    from torch._dynamo.callback import callback_handler

    stops: list[Callable[[], None]] = []

    def begin(*_args) -> None:  # torch >= 2.6 passes CallbackArgs, older releases nothing
        stops.append(start())

    def end(*_args) -> None:
        while stops:
            stops.pop()()

    callback_handler.register_start_callback(begin)
    callback_handler.register_end_callback(end)

    def unregister() -> None:
        if begin in callback_handler.start_callbacks:  # `torch._dynamo.reset()` clears them
            callback_handler.remove_start_callback(begin)
        if end in callback_handler.end_callbacks:
            callback_handler.remove_end_callback(end)
        end()

    return unregister
