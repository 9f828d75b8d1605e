"""Run a transformer's attention on one chosen `scaled_dot_product_attention` backend, compiled blocks included.

A backend selected around a compiled block does not reach it: the compiled graph keeps the
kernel torch chose while tracing (measured on the H200: flash, cuDNN and memory-efficient
selections made outside the blocks all ran the same kernel, `attention_outside` in
results/2026-12-01-nvidia-h200.json). `use_backend` enters the selection inside each block's
forward, where dynamo traces it into the graph.

One backend, no fallback: a fallback list (`sdpa_kernel(..., set_priority=True)`) did select
cuDNN in the compiled graph, but inductor then laid the surrounding tensors out worse — the norm
and GELU kernels took 43 instead of 32 ms per forward (`attention_priority`).

Benchmark-only for now: cuDNN's attention is measured on the rollout's forward (benchmarks/README.md),
not yet on the actor's backward or through role processes, so `omnirl run` keeps torch's choice.
"""

from __future__ import annotations

import types
from collections.abc import Sequence

from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
"""Backend name → the one `SDPBackend` it allows ("auto" = torch chooses per call)."""


def backends(name: str) -> list[SDPBackend]:
    """The SDPA backends `name` allows. Raises ValueError for an unknown name."""
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of auto, {', '.join(BACKENDS)}")
    return [BACKENDS[name]]


def use_backend(module: nn.Module, block_names: Sequence[str], name: str) -> int:
    """Make every block of `module` whose class name is in `block_names` run its SDPA calls on
    backend `name`, eager or compiled (call before compiling); returns how many blocks ("auto":
    none, torch chooses). Survives `copy.deepcopy` (the forward is a method of the block).

    Raises:
        ValueError: an unknown backend name, or no block matches `block_names`.
    """
    if name == "auto":
        return 0
    allowed = backends(name)
    blocks = [m for m in module.modules() if type(m).__name__ in set(block_names)]
    if not blocks:
        raise ValueError(f"no submodule of {type(module).__name__} has a class in {sorted(block_names)}")
    for block in blocks:
        block.sdpa_backends = allowed
        block.forward = types.MethodType(_forward_on_backend, block)
    return len(blocks)


def _forward_on_backend(self: nn.Module, *args, **kwargs):
    with sdpa_kernel(self.sdpa_backends):  # dynamo traces this into the block's graph
        return type(self).forward(self, *args, **kwargs)

