"""Load a run's rollout policy (`OUT/checkpoints/<step>/policy.safetensors`) into an adapter."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from omnirl.api.spec import LoRASpec, is_lora_tensor
from omnirl.models.lora import inject_lora
from omnirl.models.protocol import ModelAdapter


def checkpoint_dir(path: str | Path) -> Path:
    """`path` itself, or `path/latest` when given a checkpoints root. Raises FileNotFoundError."""
    p = Path(path)
    if (p / "latest").exists():
        p = p / "latest"
    if not (p / "policy.safetensors").is_file():
        raise FileNotFoundError(f"{path}: no policy.safetensors; pass a run's checkpoint dir, e.g. OUT/checkpoints/latest")
    return p.resolve()


def load_policy(adapter: ModelAdapter, path: str | Path, lora: LoRASpec) -> dict:
    """Bind the checkpoint's policy tensors into `adapter.module` (LoRA injected first when the
    checkpoint holds adapters); returns the checkpoint's state.json.

    Raises:
        FileNotFoundError: not a checkpoint.
        KeyError: tensor names do not match the model (wrong model family or LoRA settings).
    """
    ckpt = checkpoint_dir(path)
    state = json.loads((ckpt / "state.json").read_text())
    tensors = load_file(ckpt / "policy.safetensors")
    module = adapter.module
    if state.get("lora"):
        inject_lora(module, lora, lora.targetModules or adapter.lora_target_modules)
        own = {k: v for k, v in module.state_dict().items() if is_lora_tensor(k)}
    else:
        own = module.state_dict()
    missing, unexpected = sorted(set(own) - set(tensors)), sorted(set(tensors) - set(own))
    if missing or unexpected:
        raise KeyError(f"{ckpt}: policy tensors do not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    with torch.no_grad():
        for k, t in own.items():
            t.copy_(tensors[k])
    return state
