"""LoRA on any adapter's module, shared by the actor and the rollout workers (peft).

Both sides inject adapters with the same config, so the names the actor broadcasts
(`...attn.qkv.lora_A.default.weight`) are the names a worker binds.
"""

from __future__ import annotations

import torch
from torch import nn

from omnirl.api.spec import LoRASpec, is_lora_tensor
from omnirl.models.protocol import ModelAdapter

DEFAULT = "default"


def inject_lora(module: nn.Module, lora: LoRASpec, targets: list[str], adapter_name: str = DEFAULT) -> None:
    """Add a peft LoRA adapter to `module` in place (names gain `.lora_A.<adapter_name>.`).

    Raises:
        ValueError: no module matched the target names (LoRA would train nothing).
    """
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=targets, lora_dropout=0.0)
    inject_adapter_in_model(config, module, adapter_name=adapter_name)
    n = sum(1 for name, _ in module.named_parameters() if f".lora_A.{adapter_name}." in name)
    if n == 0:
        raise ValueError(f"model.lora.targetModules={targets} matched no module; LoRA would train nothing")


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
