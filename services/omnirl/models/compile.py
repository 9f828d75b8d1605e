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

from collections.abc import Sequence

import torch
from torch import nn

RECOMPILE_LIMIT = 64
"""Graphs kept per block code object: block variants × (train, no-grad, adapters off) × size-1."""


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
        block.compile(dynamic=dynamic, mode=mode)
    return len(blocks)


def compile_adapter_module(adapter, *, dynamic: bool = True, mode: str | None = None) -> int:
    """`compile_blocks` on `adapter.module` with the adapter's declared block types, and the
    adapter's packed (mixed-shape) forward when it has one (`compile_packed`)."""
    names = block_types(adapter.module, getattr(adapter, "compile_block_types", None))
    count = compile_blocks(adapter.module, names, dynamic=dynamic, mode=mode)
    if hasattr(adapter, "compile_packed"):
        adapter.compile_packed(dynamic=dynamic, mode=mode)
    return count
