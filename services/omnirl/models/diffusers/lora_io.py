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

PIPELINES = {"SD3Adapter": "StableDiffusion3Pipeline", "QwenImageAdapter": "QwenImagePipeline", "FluxAdapter": "FluxPipeline"}
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
        adapter: an `SD3Adapter` or `QwenImageAdapter` whose module carries a peft LoRA.
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
    import diffusers

    kind = type(adapter).__name__
    if kind not in PIPELINES:
        raise ValueError(f"save_lora supports {sorted(PIPELINES)}; got {kind}")
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
    from peft import LoraConfig

    metadata = LoraConfig(r=rank, lora_alpha=alpha, target_modules=sorted(layers), lora_dropout=0.0,
                          init_lora_weights=True).to_dict()
    metadata["target_modules"] = sorted(layers)
    pipeline_cls = getattr(diffusers, PIPELINES[kind])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pipeline_cls.save_lora_weights(str(out), transformer_lora_layers=state, weight_name=WEIGHT_NAME,
                                   transformer_lora_adapter_metadata=metadata, safe_serialization=True)
    return out / WEIGHT_NAME
