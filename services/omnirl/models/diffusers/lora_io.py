"""Save an adapter's LoRA in diffusers' format, loadable by `pipeline.load_lora_weights(out_dir)`.

The LoRA may have been injected by peft directly (`omnirl.models.lora.inject_lora`, parameter
names `<module>.lora_A.<adapter>.weight`) or by diffusers' `add_adapter`; either way the file holds
`transformer.<module>.lora_A.weight` / `.lora_B.weight` (peft's state-dict naming, which
`get_peft_model_state_dict` also produces) plus the LoRA config as safetensors metadata, so the
loader restores rank and alpha exactly (without it diffusers would assume alpha = rank).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor

from omnirl.models.protocol import ModelAdapter

WEIGHT_NAME = "pytorch_lora_weights.safetensors"


def _lora_layers(module: torch.nn.Module, adapter_name: str) -> dict[str, tuple[int, float]]:
    """{module name: (rank, alpha)} of peft LoRA layers carrying `adapter_name`."""
    from peft.tuners.lora import LoraLayer

    return {name: (int(layer.r[adapter_name]), float(layer.lora_alpha[adapter_name]))
            for name, layer in module.named_modules()
            if isinstance(layer, LoraLayer) and adapter_name in layer.r}


def diffusers_lora_state(named: Iterable[tuple[str, Tensor]], adapter_name: str = "default") -> dict[str, Tensor]:
    """Parameter names `X.lora_A.<adapter>.weight` → `X.lora_A.weight` (fp32 CPU copies).

    Accepts `module.named_parameters()` or the full tensors of `omnirl.actor.fsdp.gather_full_state`.
    """
    tag = f".{adapter_name}."
    out = {}
    for name, tensor in named:
        if ("lora_A" in name or "lora_B" in name) and tag in name:
            out[name.replace(tag, ".")] = tensor.detach().to("cpu", torch.float32).contiguous()
    return out


def save_lora(adapter: ModelAdapter, out_dir: str | Path, *, adapter_name: str = "default",
              tensors: Iterable[tuple[str, Tensor]] | None = None) -> Path:
    """Write `adapter.module`'s LoRA as `out_dir/pytorch_lora_weights.safetensors` (diffusers format).

    Args:
        adapter: a diffusers family's adapter (its class names its `pipeline`) whose module carries a peft LoRA.
        out_dir: directory to write (created).
        adapter_name: the peft adapter to save.
        tensors: full (unsharded) `(name, tensor)` pairs to save instead of the module's own
            parameters, e.g. from an FSDP-sharded actor; names as in `named_parameters()`.
    Returns:
        The file written.
    Raises:
        ValueError: unsupported adapter class, no LoRA layer, or LoRA layers with different
            rank/alpha (diffusers' metadata holds one pair here).
    """
    kind = type(adapter).__name__
    pipeline = getattr(type(adapter), "pipeline", None)
    if not isinstance(pipeline, str):
        raise ValueError(f"save_lora supports the diffusers families' adapters (a `pipeline` class name); got {kind}")
    layers = _lora_layers(adapter.module, adapter_name)
    if not layers:
        raise ValueError(f"{kind}.module has no LoRA adapter named {adapter_name!r}; nothing to save")
    pairs = set(layers.values())
    if len(pairs) != 1:
        raise ValueError(f"LoRA layers use several (rank, alpha) pairs {sorted(pairs)}; save_lora needs one")
    (rank, alpha), = pairs
    state = diffusers_lora_state(tensors if tensors is not None else adapter.module.named_parameters(), adapter_name)
    expected = 2 * len(layers)
    if len(state) != expected:
        raise ValueError(f"found {len(state)} LoRA tensors for {len(layers)} LoRA layers (expected {expected})")
    return save_lora_state(pipeline, state, rank, alpha, out_dir)


def save_lora_state(pipeline: str, state: dict[str, Tensor], rank: int, alpha: float, out_dir: str | Path) -> Path:
    """Write diffusers-named LoRA tensors (`X.lora_A.weight`, `X.lora_B.weight`, see
    `diffusers_lora_state`) as `out_dir/pytorch_lora_weights.safetensors` with the LoRA config
    (rank, alpha, target modules) as metadata, through `<pipeline>.save_lora_weights`.

    Args:
        pipeline: the diffusers pipeline class name, e.g. "StableDiffusion3Pipeline".
        state: the tensors, without a `transformer.` prefix (the pipeline adds it).
        rank, alpha: the LoRA rank r and alpha (the update is scaled by alpha / r).
    Returns:
        The file written.
    Raises:
        ValueError: a tensor name that is not `<module>.lora_A.weight` / `.lora_B.weight`, or a
            lora_A whose row count is not `rank`.
    """
    import diffusers
    from peft import LoraConfig

    modules = set()
    for name, tensor in state.items():
        module, sep, part = name.rpartition(".lora_")
        if not sep or part not in ("A.weight", "B.weight"):
            raise ValueError(f"LoRA tensor {name!r} is not named <module>.lora_A.weight or <module>.lora_B.weight")
        if part == "A.weight" and tensor.shape[0] != rank:
            raise ValueError(f"LoRA tensor {name!r} has rank {tensor.shape[0]}, the config says {rank}")
        modules.add(module)
    metadata = LoraConfig(r=rank, lora_alpha=alpha, target_modules=sorted(modules), lora_dropout=0.0,
                          init_lora_weights=True).to_dict()
    metadata["target_modules"] = sorted(modules)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    getattr(diffusers, pipeline).save_lora_weights(str(out), transformer_lora_layers=state, weight_name=WEIGHT_NAME,
                                                   transformer_lora_adapter_metadata=metadata,
                                                   safe_serialization=True)
    return out / WEIGHT_NAME
