"""Checkpoints without pickle: safetensors for tensors, JSON for everything else.

Layout of one checkpoint directory (`OUT/checkpoints/step-000010/`, `latest` points at the
newest):

| file | contents |
| --- | --- |
| `policy.safetensors` | the weights rollout samples from (full state dict, or LoRA adapters) — what `omnirl eval --checkpoint` loads |
| `trained.safetensors` | θ's trainable tensors |
| `old.safetensors` | DiffusionNFT's old policy or AWM's EMA anchor (when present) |
| `optimizer.safetensors` + `optimizer.json` | AdamW state tensors; param groups and scalars |
| `state.json` | step, policy_version, optimizer steps, RNG seeds, the controller's data position, the LoRA flag, the job name and model family |

| `COMPLETE` | written last: a checkpoint without it is ignored |

A checkpoint is complete or absent: it is written to a temporary directory, the `COMPLETE` marker
last, fsynced, renamed into place and only then is `latest` repointed (`policy_io.publish`), so a
crash (SIGKILL mid-write, a full disk, a power cut) never leaves a half-written or missing `latest`.
A step saved again (the replay after a kill between a save's rename and its `latest`) replaces its
old copy only once the new one is in place.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from omnirl.models.policy_io import (  # the one "where is the checkpoint"
    COMPLETE,
    publish,
    resolve_checkpoint,
)
from omnirl.system.disk import readable, readable_as_umask_allows


def _contiguous(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().contiguous() for k, v in tensors.items()}


def optimizer_to_flat(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """AdamW state → (tensors `state.{param_index}.{name}`, JSON-able param groups and scalars)."""
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for name, value in st.items():
            if torch.is_tensor(value):
                tensors[f"state.{idx}.{name}"] = value
            else:
                scalars[f"{idx}.{name}"] = value
    return _contiguous(tensors), {"param_groups": sd["param_groups"], "scalars": scalars}


def optimizer_from_flat(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    """Inverse of `optimizer_to_flat`; raises ValueError if the parameter count differs."""
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = value
    for key, value in meta["scalars"].items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    expected = sum(len(g["params"]) for g in optimizer.state_dict()["param_groups"])
    got = sum(len(g["params"]) for g in meta["param_groups"])
    if expected != got:
        raise ValueError(f"checkpoint optimizer has {got} parameters, the model {expected}: wrong checkpoint?")
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def save_checkpoint(root: str | Path, step: int, *, policy: dict[str, torch.Tensor], trained: dict[str, torch.Tensor],
                    old: dict[str, torch.Tensor] | None, optimizer: tuple[dict[str, torch.Tensor], dict], state: dict,
                    keep: int = 2) -> Path:
    """Write `root/step-{step:06d}/` atomically and durably, repoint `root/latest`, prune to `keep` + latest.

    `optimizer` is `optimizer_to_flat`'s (tensors, meta), full (unsharded) tensors.
    Returns the checkpoint directory (`step-{step:06d}.K` when `latest` named that step already:
    see `policy_io.publish`).

    Raises:
        OSError (or safetensors' `SafetensorError` carrying the system's text, see
        `omnirl.system.disk.storage_error`): a write failed, e.g. no space left; the partly written
        temporary directory is removed and `latest` is unchanged.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}-{os.getpid()}"
    for stale in root.glob(".tmp-step-*"):  # a killed writer's leftovers (one writer per job: rank 0)
        shutil.rmtree(stale, ignore_errors=True)
    tmp.mkdir()
    try:
        save_file(_contiguous(policy), tmp / "policy.safetensors")
        save_file(_contiguous(trained), tmp / "trained.safetensors")
        if old is not None:
            save_file(_contiguous(old), tmp / "old.safetensors")
        opt_tensors, opt_meta = optimizer
        save_file(_contiguous(opt_tensors), tmp / "optimizer.safetensors")
        (tmp / "optimizer.json").write_text(json.dumps(opt_meta))
        (tmp / "state.json").write_text(json.dumps(state, indent=1))
        readable_as_umask_allows(tmp)  # safetensors writes 0600
        (tmp / COMPLETE).write_text(str(step))
    except BaseException:
        # a full disk (or a kill signal turned exception): the half-written files would hold the space the
        # error asks the user to free until the next save; `latest` still names the last complete checkpoint
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # fsynced, renamed, `latest` switched; the step written again never loses its old copy first
    return publish(root, tmp, final, keep)


def load_checkpoint(path: str | Path) -> dict:
    """Read a checkpoint: {'dir', 'policy', 'trained', 'old' (or None), 'optimizer': (tensors, meta), 'state'}.

    Raises:
        FileNotFoundError: not a (complete) checkpoint, or one of its files is missing.
        ValueError: a file is truncated or corrupt, or optimizer.json lacks an entry; the message
            starts with the file's name (the actor's resume error said only "scalars").
    """
    p = resolve_checkpoint(path)
    old = _read(p, "old.safetensors") if (p / "old.safetensors").exists() else None
    meta = _read(p, "optimizer.json")
    for key in ("param_groups", "scalars"):
        if not isinstance(meta, dict) or key not in meta:
            raise ValueError(f"optimizer.json: no {key!r} entry")
    return {
        "dir": p,
        "policy": _read(p, "policy.safetensors"),
        "trained": _read(p, "trained.safetensors"),
        "old": old,
        "optimizer": (_read(p, "optimizer.safetensors"), meta),
        "state": _read(p, "state.json"),
    }


def _read(ckpt: Path, name: str):
    """One file of checkpoint `ckpt`: JSON or safetensors by its suffix; a damaged one raises
    ValueError naming it."""
    try:
        return json.loads((ckpt / name).read_text()) if name.endswith(".json") else load_file(readable(ckpt / name))
    except (SafetensorError, ValueError) as err:
        raise ValueError(f"{name}: {err}") from err
