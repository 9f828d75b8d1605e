"""What the built-in families (`ocr-digits`: `digits/`, `av-digits`: `avdigits/`) share: their checkpoint layout,
a directory of `CONFIG_FILE` (the family's model config and provenance) and `WEIGHTS_FILE` (safetensors), loading
those weights into the family's module, and exporting a trained policy in the same layout (`omnirl export`).
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from omnirl.api.spec import RLJob
from omnirl.system.disk import readable

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def load_weights(module: nn.Module, directory: Path) -> None:
    """Load `directory`'s `WEIGHTS_FILE` into `module` (strict: every tensor, each of its shape).

    Raises:
        PermissionError: the file may not be read (the system's error, not a damaged file).
        ValueError: the file is unreadable (truncated, not safetensors), or its tensors do not match the module
            built from `directory`'s `CONFIG_FILE`.
    """
    weights = directory / WEIGHTS_FILE
    readable(weights)  # no permission is no damaged file: the system's error, not safetensors' ENOENT
    try:
        state = load_file(str(weights))
    except (OSError, SafetensorError) as err:  # a damaged file, not a config mismatch: say so
        raise ValueError(f"{weights} is unreadable (truncated or not a safetensors file: {err}); copy it again "
                         "from its source, or re-export the checkpoint") from err
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ValueError(f"{weights} does not match the config in {directory / CONFIG_FILE}: {err}") from err


def export_weights(job: RLJob, policy: Path, lora: bool, out: Path, state: dict, *, base: Path, meta: dict,
                   what: str) -> list[str]:
    """A trained policy in the built-in layout: `CONFIG_FILE` (the base's model config with the post-training
    provenance) + `WEIGHTS_FILE`, a LoRA merged into the base's weights.

    Args:
        policy: the checkpoint's policy safetensors (full weights, or LoRA pairs when `lora`).
        state: the checkpoint's trainer state (`step`, `policy_version`).
        base: the base model directory; meta: its parsed `CONFIG_FILE` (`format`, `model`, `provenance`).
        what: the base model as an error names it ("the digits model in DIR").
    Returns:
        the files written into `out`.
    Raises:
        ValueError: a full policy whose tensor names are not the base's, or LoRA pairs that do not fit it.
    """
    from omnirl.models.export import link_or_copy, merge_lora, same_keys, tensor_keys

    base_weights = base / WEIGHTS_FILE
    if lora:
        merged = merge_lora(load_file(str(readable(base_weights))), load_file(str(readable(policy))),
                            job.spec.model.lora.alpha)
        save_file(merged, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    else:
        same_keys(tensor_keys([policy]), tensor_keys([base_weights]), what)
        link_or_copy(policy, out / WEIGHTS_FILE)
    provenance = {"base": str(job.spec.model.path), "base_provenance": meta.get("provenance", {}),
                  "post_trained_by": f"omnirl {job.spec.algorithm.name}, job {job.metadata.name}",
                  "step": int(state["step"]), "policy_version": int(state["policy_version"]), "lora_merged": lora}
    config = {"format": meta["format"], "model": meta["model"], "provenance": provenance}
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return [CONFIG_FILE, WEIGHTS_FILE]
