"""Which `scaled_dot_product_attention` kernel a model's transformer blocks run (`spec.model.attention`).

Why choose at all: in the compiled blocks torch picks FlashAttention-2 for bf16 on Hopper
(profiled), and cuDNN's attention is 1.45-1.55x faster there at head dim 64 (SD3.5's); the
compiled SD3.5-Medium-sized rollout went from 54.4 % to 57.9 % MFU with it (benchmarks/README.md,
"attention"). Forward and backward at head dims 8-128 differ from the fp32 reference no more than
FlashAttention-2's do (measured on the H200, bf16); SD3's and Qwen-Image's velocities and
gradients match torch's own choice (4 SD3.5-Medium blocks at 512²: input gradient within 1.4e-3
relative). FLUX's gradients through cuDNN did not (wrong by ~1e30), so `auto` leaves FLUX to torch.

Why inside each block: a backend selected around a compiled block does not reach it — the
compiled graph keeps the kernel torch chose while tracing (measured: flash, cuDNN and
memory-efficient selections made outside all ran the same kernel). `use_backend` enters the
selection inside each block's forward, where dynamo traces it into the graph; eager code that
runs a block's attention by hand (the packed SD3 forward) enters `block_backend(block)`.

One backend, no fallback: a fallback list (`sdpa_kernel(..., set_priority=True)`) did select cuDNN
in the compiled graph, but inductor then laid the surrounding tensors out worse (norm and GELU
kernels 43 instead of 32 ms per forward).
"""

from __future__ import annotations

import contextlib
import logging
import types
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from omnirl.api.errors import config_errors
from omnirl.api.spec import CUDNN_FAMILIES, ModelSpec
from omnirl.models.registry import resolve_dtype

log = logging.getLogger("omnirl.models")

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
"""Backend name → the one `SDPBackend` it allows (the benchmarks compare all four; a manifest
takes `spec.model.attention`'s values: auto, torch, cudnn, math)."""


def backends(name: str) -> list[SDPBackend]:
    """The SDPA backends `name` allows. Raises ValueError for a name outside `BACKENDS`."""
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of torch, {', '.join(BACKENDS)}")
    return [BACKENDS[name]]


def head_dim(module: nn.Module) -> int | None:
    """The attention head dimension from a diffusers model's config (`attention_head_dim`), else None."""
    value = getattr(getattr(module, "config", None), "attention_head_dim", None)
    return int(value) if isinstance(value, int) else None


def resolve(name: str, family: str, module: nn.Module, device: torch.device | str, dtype: torch.dtype) -> str:
    """The backend `spec.model.attention` value `name` means for `module` (of model family
    `family`) on `device` with weights in `dtype`.

    "auto" is "cudnn" where it was measured faster and checked correct — a family in
    `CUDNN_FAMILIES` on a Hopper GPU (compute capability 9.x: H100, H200; other generations were
    not measured), bf16 or fp16 weights, and a head dimension from the model's config that
    cuDNN's kernel takes (`_cudnn_head_dim_ok`) — else "torch". Every other name is itself (the
    spec refuses cudnn for other families, off nvidia roles or with float32 weights).

    Raises:
        ValueError: "cudnn" where its kernel cannot run — not a CUDA device (`omnirl run --device
            cpu` of a GPU manifest), a GPU older than Ampere (compute capability < 8.0), or a head
            dimension it does not take; the message names `spec.model.attention` and the fix.
    """
    device = torch.device(device)
    dim = head_dim(module)
    if name == "auto":
        fits = (family in CUDNN_FAMILIES and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9
                and dtype in (torch.bfloat16, torch.float16) and dim is not None and _cudnn_head_dim_ok(dim))
        return "cudnn" if fits else "torch"
    if name == "cudnn":
        if device.type != "cuda":
            raise ValueError(f"spec.model.attention: cudnn runs on CUDA GPUs only, and this role runs on {device}; "
                             "set auto or torch")
        capability = torch.cuda.get_device_capability(device)
        if capability < (8, 0):
            raise ValueError(f"spec.model.attention: cudnn needs an NVIDIA GPU of compute capability 8.0 or newer "
                             f"(Ampere+), and {torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}; "
                             "set auto or torch")
        if dim is not None and not _cudnn_head_dim_ok(dim):
            raise ValueError(f"spec.model.attention: cudnn takes head dimensions that are multiples of 8 up to 128, "
                             f"and this model's attention_head_dim is {dim}; set auto or torch")
    return name


def _cudnn_head_dim_ok(dim: int) -> bool:
    """Whether cuDNN's SDPA kernel takes head dimension `dim` (torch's check: a multiple of 8, at most 128)."""
    return dim % 8 == 0 and dim <= 128


def use_backend(module: nn.Module, block_names: Sequence[str], name: str) -> int:
    """Make every block of `module` whose class name is in `block_names` run its SDPA calls on
    backend `name`, eager or compiled (call before compiling, checkpointing or sharding); returns
    how many blocks ("torch": none, torch chooses). Survives `copy.deepcopy` (the forward is a
    method of the block).

    Raises:
        ValueError: a name outside `BACKENDS` and "torch", or no block matches `block_names`.
    """
    if name == "torch":
        return 0
    allowed = backends(name)
    blocks = [m for m in module.modules() if type(m).__name__ in set(block_names)]
    if not blocks:
        raise ValueError(f"no submodule of {type(module).__name__} has a class in {sorted(block_names)}")
    for block in blocks:
        block.sdpa_backends = allowed
        block.forward = types.MethodType(_forward_on_backend, block)
    return len(blocks)


def block_backend(block: nn.Module) -> contextlib.AbstractContextManager:
    """The backend selection `use_backend` gave `block`, as a context for eager code that runs the
    block's attention itself; a no-op for a block torch chooses for."""
    allowed = getattr(block, "sdpa_backends", None)
    return sdpa_kernel(allowed) if allowed is not None else contextlib.nullcontext()


def select_attention(adapter, model: ModelSpec, device: torch.device | str) -> str:
    """Apply `model.attention` to `adapter` (rollout and actor call this before LoRA, compile and
    sharding): `resolve` it for the adapter's module, `device` and `model.dtype`, then `use_backend`
    on the adapter's repeated blocks (`compile_block_types`). Logs and returns the backend the
    blocks run ("torch": torch's choice).

    Raises:
        ConfigError: a named kernel that cannot run here (the message names the field and the fix).
    """
    with config_errors("spec.model.attention"):
        chosen = resolve(model.attention, model.family, adapter.module, device, resolve_dtype(model.dtype))
    if chosen != "torch":
        use_backend(adapter.module, adapter.compile_block_types, chosen)
    log.info("attention: %s (spec.model.attention %s)", chosen, model.attention)
    return chosen


def _forward_on_backend(self: nn.Module, *args, **kwargs):
    with sdpa_kernel(self.sdpa_backends):  # dynamo traces this into the block's graph
        return type(self).forward(self, *args, **kwargs)
