"""Load a run's rollout policy (`OUT/checkpoints/<step>/policy.safetensors`) into an adapter; where a
checkpoint is (`resolve_checkpoint`), whose it is (`check_owner`) and the `step-*` + `latest` layout
checkpoints and exports share (`publish`, `make_latest`)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from omnirl.api.spec import LoRASpec, RLJob, is_lora_tensor
from omnirl.models.lora import inject_lora
from omnirl.models.protocol import ModelAdapter
from omnirl.system.disk import readable, sync_dir, sync_tree

LATEST = "latest"
COMPLETE = "COMPLETE"
POLICY_FILE = "policy.safetensors"


def exported_from(export: Path) -> Path | None:
    """The checkpoint an export (`omnirl export`, `OUT/exports/step-*`) was made from, as its `export.json`
    records it, when that checkpoint is still on this machine (it holds `policy.safetensors`); else None
    (pruned by `checkpoint.keep`, a pod's path, or no readable `export.json`: only the hint is lost)."""
    try:
        ckpt = json.loads((export / "export.json").read_text()).get("checkpoint")
    except (OSError, json.JSONDecodeError, AttributeError):  # AttributeError: a JSON document that is no object
        return None
    return Path(ckpt) if isinstance(ckpt, str) and (Path(ckpt) / POLICY_FILE).is_file() else None


def has_checkpoint(root: str | Path) -> bool:
    """True when `root/latest` is a complete checkpoint (what `OMNIRL_RESUME=auto` resumes from; the controller
    exports it when every step was trained before it started)."""
    latest = Path(root) / LATEST
    return (latest / COMPLETE).is_file() and (latest / POLICY_FILE).is_file()


def resolve_checkpoint(path: str | Path) -> Path:
    """The one answer to "where is the checkpoint": `path` itself, or `path/latest` when given a
    checkpoints root (the layout of `omnirl.actor.checkpoint`), resolved.

    Raises:
        FileNotFoundError: `path` does not exist, no policy.safetensors there, or no COMPLETE marker
            (its writer died).
    """
    p = Path(path)
    if not p.exists():  # e.g. a step-* directory pruned by checkpoint.keep: "no policy.safetensors" misled
        raise FileNotFoundError(f"{path}: does not exist; pass a checkpoint the run still keeps "
                                "(OUT/checkpoints/latest, or a step-* directory there)")
    if p.is_file():  # a file of the checkpoint (its policy.safetensors, state.json): "FILE: no policy.safetensors" misled
        where = p.parent if (p.parent / POLICY_FILE).is_file() else None
        raise FileNotFoundError(f"{path} is a file; pass " + (f"the checkpoint directory that holds it, {where}" if where
                                                             else "a run's checkpoint dir, e.g. OUT/checkpoints/latest"))
    if (p / LATEST).exists():
        p = p / LATEST
    p = p.resolve()
    if not (p / POLICY_FILE).is_file():
        if (p / "checkpoints").is_dir():  # the run directory itself, `omnirl run --out`
            hint = f"it is a run directory: pass {Path(path) / 'checkpoints' / LATEST}"
        elif (p / "export.json").is_file():  # OUT/exports/latest: the model as users load it
            source = exported_from(p)  # naming it beats a generic OUT/checkpoints/latest, which may be newer
            hint = (f"it is an export (the trained model as users load it): evaluate it as model.path: {path} "
                    "in a manifest, or pass " + (f"the checkpoint it was exported from, {source}" if source
                                                 else "the run's OUT/checkpoints/latest"))
        else:
            hint = "pass a run's checkpoint dir, e.g. OUT/checkpoints/latest"
        raise FileNotFoundError(f"{path}: no {POLICY_FILE}; {hint}")
    if not (p / COMPLETE).is_file():
        raise FileNotFoundError(f"{path}: an incomplete checkpoint (no {COMPLETE} marker: its writer died); "
                                "use an older step-* directory")
    return p


def check_owner(job: RLJob, ckpt: Path, state: dict, manifest: str) -> None:
    """Refuse a manifest of another job or model family than the checkpoint's (recorded by the
    actor in `state.json`; checkpoints written before it recorded them are not checked): `omnirl
    export` and `omnirl eval` alike.

    Args:
        job: the manifest given. ckpt: the resolved checkpoint. state: its state.json.
        manifest: how the command takes the run's own manifest, for the fix (`--job`).
    Raises:
        ValueError: naming both jobs (or families) and the fix; or a manifest whose `spec.model.lora` differs
            from the checkpoint's: LoRA on or off, or (recorded since 2026-12-03, `lora_settings`) another
            rank, alpha or targetModules, naming each field with both values.
    """
    mine = {"job": job.metadata.name, "family": job.spec.model.family}
    for key, what in (("job", "job"), ("family", "model family")):
        if key in state and state[key] != mine[key]:
            raise ValueError(f"{ckpt} is a checkpoint of {what} {state[key]!r} but the manifest is for {what} "
                             f"{mine[key]!r}; pass the run's own manifest ({manifest}) or that job's checkpoint")
    lora = job.spec.model.lora
    if bool(state.get("lora")) != lora.enabled:
        raise ValueError(f"{ckpt} holds {'LoRA adapters' if state.get('lora') else 'full weights'} but the manifest's "
                         f"spec.model.lora.enabled is {lora.enabled}; pass the run's own manifest ({manifest})")
    # the adapters' rank, scale (alpha / rank) and layers: another rank crashed `omnirl eval` on a tensor copy, and
    # another alpha merged the adapters into an export at the wrong scale without a word
    written = state.get("lora_settings") or {}
    changed = [f"spec.model.lora.{key} {written[key]!r} (the manifest: {getattr(lora, key)!r})"
               for key in ("rank", "alpha", "targetModules") if key in written and
               not _same_lora_value(key, written[key], getattr(lora, key), job.spec.model.family)]
    if changed:
        raise ValueError(f"{ckpt} was trained with {', '.join(changed)}: its adapters mean something else under "
                         f"the manifest's; pass the run's own manifest ({manifest}), or put those values back")


def _same_lora_value(key: str, written: object, manifest: object, family: str) -> bool:
    """Whether a checkpoint's `lora_settings[key]` and the manifest's value make the same adapters: targetModules
    compare as the layer names they resolve to, empty meaning the family's defaults, in any order (the manifest
    that spelled out the built-in model's defaults was refused against its own run's `[]`)."""
    if key != "targetModules":
        return written == manifest
    from omnirl.models.registry import default_lora_targets

    def resolved(targets: object) -> set[str]:
        return set(targets or default_lora_targets(family))  # type: ignore[arg-type]

    return resolved(written) == resolved(manifest)


def publish(root: Path, tmp: Path, final: Path, keep: int) -> Path:
    """Make the written directory `tmp` (in `root`) the step directory `final` (`root/step-*`) and
    `root/latest`, then prune as `make_latest`: how checkpoints and exports are published.

    Crash-safe: `tmp` is fsynced (files and directories) before its rename and `root` after the rename
    and after `latest` is switched, so after a kill or a power cut `latest` names a complete directory,
    the old one or the new one. Copies of the same step already there are deleted only once `latest`
    names the new one. When `latest` names `final` itself (a restarted controller exporting the last
    step again), the new copy goes to `step-NNNNNN.K` (replacing it in place would leave `latest`
    naming nothing between two renames); a copy `latest` does not name (a writer killed before it
    switched `latest`) is renamed aside (`.tmp-*`) to make room.

    Returns:
        The published directory: `final`, or `step-NNNNNN.K`.
    Raises:
        OSError: a rename or an fsync failed; `latest` names a complete directory still.
    """
    sync_tree(tmp)
    link = root / LATEST
    named = os.readlink(link) if link.is_symlink() else None
    base, k = final.name.split(".", 1)[0], 0
    while final.name == named:
        k += 1
        final = root / f"{base}.{k}"
    if final.exists():
        aside = root / f".tmp-{final.name}-replaced-{os.getpid()}"
        shutil.rmtree(aside, ignore_errors=True)
        final.rename(aside)
    tmp.rename(final)
    sync_dir(root)
    sync_dir(root.parent)  # `root` itself may be new (the first checkpoint of a run)
    copies = [p for p in root.iterdir() if p != final and (p.name == base or p.name.startswith(f"{base}.")
                                                          or p.name.startswith(f".tmp-{base}"))]
    make_latest(root, final, keep, replaced=copies)
    return final


_STEP_NAME = re.compile(r"step-(\d+)(?:\.(\d+))?")


def step_order(name: str) -> tuple[int, int] | None:
    """`step-NNNNNN[.K]` → (N, K) (K 0 when absent), the order of the writes; None for another name.

    By number, not by text: the zero padding is six digits, so past step 999999 `step-1000000`
    sorted before `step-999999` (and `step-000002.10` before `step-000002.2`), and pruning deleted
    the newest directories while keeping the oldest."""
    found = _STEP_NAME.fullmatch(name)
    return None if found is None else (int(found[1]), int(found[2] or 0))


def make_latest(root: Path, newest: Path, keep: int, replaced: list[Path] | None = None) -> None:
    """Point `root/latest` at `newest` (a `root/step-*` directory) and keep the `keep` newest
    `step-*` directories besides it (newest by `step_order`: by number; a directory of another name
    is never pruned): the one layout of checkpoints and exports.

    The link is swapped in by a rename, so `latest` is never missing nor half-written, and `root` is
    fsynced before anything is deleted: `replaced` (old copies of `newest`'s step, not counted
    against `keep`), then the pruned ones; `keep` < 1 prunes nothing.
    """
    link, tmp_link = root / LATEST, root / f".{LATEST}-{os.getpid()}"
    if tmp_link.is_symlink() or tmp_link.exists():
        tmp_link.unlink()
    tmp_link.symlink_to(newest.name)
    tmp_link.replace(link)
    sync_dir(root)  # a deleted directory must not be gone on disk while the old link still names it
    for p in replaced or []:
        shutil.rmtree(p, ignore_errors=True)
    steps = sorted((p for p in root.glob("step-*") if p.is_dir() and step_order(p.name) is not None),
                   key=lambda p: step_order(p.name))
    for p in steps[:-keep] if keep > 0 else []:
        if p != newest:
            shutil.rmtree(p, ignore_errors=True)


def load_policy(adapter: ModelAdapter, path: str | Path, lora: LoRASpec) -> dict:
    """Bind the checkpoint's policy tensors into `adapter.module` (LoRA injected first when the
    checkpoint holds adapters); returns the checkpoint's state.json.

    Raises:
        FileNotFoundError: not a (complete) checkpoint.
        KeyError: tensor names do not match the model (wrong model family or LoRA settings).
        ValueError: tensor shapes do not match it (another LoRA rank in a checkpoint without `lora_settings`).
    """
    ckpt = resolve_checkpoint(path)
    state = json.loads((ckpt / "state.json").read_text())
    tensors = load_file(readable(ckpt / POLICY_FILE))
    module = adapter.module
    if state.get("lora"):
        inject_lora(module, lora, lora.targetModules or adapter.lora_target_modules)
        own = {k: v for k, v in module.state_dict().items() if is_lora_tensor(k)}
    else:
        own = module.state_dict()
    missing, unexpected = sorted(set(own) - set(tensors)), sorted(set(tensors) - set(own))
    if missing or unexpected:
        raise KeyError(f"{ckpt}: policy tensors do not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    # a checkpoint older than `lora_settings` (check_owner) under another LoRA rank: a RuntimeError in the copy
    shapes = [k for k, t in own.items() if tuple(t.shape) != tuple(tensors[k].shape)]
    if shapes:
        k = shapes[0]
        raise ValueError(f"{ckpt}: policy tensor {k} has shape {list(tensors[k].shape)} but the manifest's model has "
                         f"{list(own[k].shape)} ({len(shapes)} such tensor(s); another spec.model.lora.rank or model "
                         "config); pass the run's own manifest")
    with torch.no_grad():
        for k, t in own.items():
            t.copy_(tensors[k])
    return state
