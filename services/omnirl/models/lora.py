"""LoRA on any adapter's module, shared by the actor and the rollout workers (peft).

Both sides inject adapters with the same config, so the names the actor broadcasts
(`...attn.qkv.lora_A.default.weight`) are the names a worker binds.
"""

from __future__ import annotations

import torch
from torch import nn

from omnirl.api.errors import ConfigError, config_errors
from omnirl.api.spec import LoRASpec, is_lora_tensor
from omnirl.models.protocol import ModelAdapter

DEFAULT = "default"
ADAPTABLE = (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MultiheadAttention)
"""The torch layers peft's LoRA can adapt (it refuses any other module a target names)."""


def inject_lora(module: nn.Module, lora: LoRASpec, targets: list[str], adapter_name: str = DEFAULT) -> None:
    """Add a peft LoRA adapter to `module` in place (names gain `.lora_A.<adapter_name>.`).

    Raises:
        ConfigError: naming `spec.model.lora.targetModules` and the model's linear layers, when the
            targets match no layer (LoRA would train nothing) or one peft cannot adapt: the same on
            every restart, so the role stops at once (`omnirl.api.exits.CONFIG_ERROR_EXIT`).
    """
    from peft import LoraConfig, inject_adapter_in_model

    check_targets(module, targets)
    config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=targets, lora_dropout=0.0)
    with config_errors("spec.model.lora.targetModules", ValueError):
        inject_adapter_in_model(config, module, adapter_name=adapter_name)
    n = sum(1 for name, _ in module.named_parameters() if f".lora_A.{adapter_name}." in name)
    if n == 0:
        raise ConfigError(f"spec.model.lora.targetModules: {targets} matched no module, so LoRA would train nothing")


def check_targets(module: nn.Module, targets: list[str]) -> None:
    """LoRA `targets` as peft matches them (a module's whole name or its last dot-separated parts)
    must name at least one module, and only modules peft can adapt (`ADAPTABLE`; the adapters'
    defaults name linear layers).

    Raises:
        ConfigError: naming `spec.model.lora.targetModules`, the offending target and the model's
            linear layers (their names after the last block index, e.g. `attn.qkv`).
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    # a layer that holds an adapter already (the actor's second one, `old`) is a peft layer wrapping its own
    names = {name: m for name, m in module.named_modules()
             if not any(part == "base_layer" or part.startswith("lora_") for part in name.split("."))}
    linear = sorted({_suffix(name) for name, m in names.items()
                     if isinstance(m, nn.Linear) or isinstance(getattr(m, "base_layer", None), nn.Linear)})
    shown = ", ".join(linear[:16]) + (", ..." if len(linear) > 16 else "")
    fix = f"list linear layers of {type(module).__name__}: {shown} (empty: the model's defaults)"
    matched = False
    for target in targets:
        hits = [name for name in names if name == target or name.endswith("." + target)]
        other = next((name for name in hits if not isinstance(names[name], (*ADAPTABLE, BaseTunerLayer))), None)
        if other is not None:
            raise ConfigError(f"spec.model.lora.targetModules: {target!r} names {other}, a "
                              f"{type(names[other]).__name__}, which LoRA cannot adapt; {fix}")
        matched = matched or bool(hits)
    if not matched:
        raise ConfigError(f"spec.model.lora.targetModules: {targets} match no layer of the model, so LoRA would "
                          f"train nothing; {fix}")


def _suffix(name: str) -> str:
    """A layer's name after its last numeric part (`blocks.3.attn.qkv` → `attn.qkv`): what a target names."""
    parts = name.split(".")
    last = max((i for i, part in enumerate(parts[:-1]) if part.isdigit()), default=-1)
    return ".".join(parts[last + 1:])


def tuner_layers(module: nn.Module) -> list[nn.Module]:
    """peft's LoRA-carrying layers inside `module`."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in module.modules() if isinstance(m, BaseTunerLayer)]


def lora_tensors(module: nn.Module, adapter_name: str = DEFAULT) -> dict[str, torch.Tensor]:
    """LoRA parameters of one adapter, keyed by their names with the adapter name as `default`."""
    tag = f".{adapter_name}."
    return {
        name.replace(tag, f".{DEFAULT}."): p
        for name, p in module.named_parameters()
        if is_lora_tensor(name) and tag in name
    }


def prepare_rollout_module(adapter: ModelAdapter, lora: LoRASpec) -> None:
    """Give a rollout worker's model the tensor names the actor broadcasts (LoRA injected)."""
    if lora.enabled:
        inject_lora(adapter.module, lora, lora.targetModules or adapter.lora_target_modules)
    adapter.module.requires_grad_(False)
    adapter.module.eval()
