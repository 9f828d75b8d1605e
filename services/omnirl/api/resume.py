"""The manifest fields a resumed run must keep: those that shaped the work its predecessor left behind.

A resumed controller (`omnirl run --resume`, a restart with `OMNIRL_RESUME=auto`, a pod replaced after
a spec edit) starts at the step after the actor's and rebuilds the books of the steps its predecessor
published from its own manifest, not from what was published (`controller/loop.py::_publish_step`): the
step's prompts (drawn at the stored data position, in the order `seed` and `shuffle` give, from
`trainPrompts`, `promptsPerStep` of them), each group's sample ids and seeds (`groupSize`, `seed`) and the
SDE transition its samples were drawn with (FlowGRPO's `noiseLevel` and `sdeType`, copied into every
`TrainItem`). With another value the rebuilt book names groups or samples that were never requested and
waits for them for ever (a larger `groupSize` or `promptsPerStep`; another `seed`, `shuffle` or prompt
file draws other prompts), or the actor recomputes the log-probs of samples drawn with one noise level
under another. Hyperparameters that shape nothing stored (learning rate, clip range, KL, steps,
validation, …) may change; the checkpoint's own layout (LoRA, the model family) is checked by the actor
and `launch/preflight.py::check_same_job`.

Read by the launcher's `--resume` pre-flight (against `OUT/job.yaml`) and by the operator before it
applies an edited spec of a live job (against its `J-spec` ConfigMap). Standard library only.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

RESUME_FIXED: tuple[str, ...] = (
    "spec.algorithm.groupSize",
    "spec.algorithm.promptsPerStep",
    "spec.seed",
    "spec.data.trainPrompts",
    "spec.data.shuffle",
    "spec.algorithm.flowGrpo.noiseLevel",
    "spec.algorithm.flowGrpo.sdeType",
)
"""Dotted paths in the manifest (camelCase, as `loader.dump_rljob` writes it) a resume must keep."""

_ABSENT = object()


def _get(doc: Any, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(doc, dict) or key not in doc:
            return _ABSENT
        doc = doc[key]
    return doc


PATHS = frozenset({"spec.data.trainPrompts"})
"""Fields holding a file path: a relative one (a manifest as written) matches an absolute one it ends
(the launcher's `job.yaml` holds the paths resolved against the manifest's folder)."""


def _same(path: str, was: Any, now: Any) -> bool:
    if was == now:
        return True
    if path not in PATHS or not isinstance(was, str) or not isinstance(now, str):
        return False
    a, b = PurePosixPath(was), PurePosixPath(now)
    if a.is_absolute() == b.is_absolute():
        return False
    rel, full = (a, b) if b.is_absolute() else (b, a)
    parts = [p for p in rel.parts if p != "."]
    return ".." not in parts and list(full.parts[-len(parts):]) == parts


def resume_changes(before: dict[str, Any], now: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """The `RESUME_FIXED` fields whose value differs between two manifests, as (field, before, now).

    Args:
        before: the manifest the run started with (a dict as `loader.dump_rljob` writes it, e.g. the run
            directory's `job.yaml` or the operator's ConfigMap); a field it lacks (an older file, another
            algorithm's block) is not compared.
        now: the manifest to resume with, in the same form.
    """
    out = []
    for path in RESUME_FIXED:
        was, value = _get(before, path), _get(now, path)
        if was is not _ABSENT and value is not _ABSENT and not _same(path, was, value):
            out.append((path, was, value))
    return out


def resume_conflict(before: dict[str, Any], now: dict[str, Any], *, where: str, fix: str) -> str | None:
    """One line naming every changed `RESUME_FIXED` field with both values, why it matters and `fix`; None
    when none changed. `where` names the run (`--resume: runs/x holds a run`, `RLJob x`)."""
    changes = resume_changes(before, now)
    if not changes:
        return None
    fields = ", ".join(f"{path} {was!r} (now {value!r})" for path, was, value in changes)
    return (f"{where} started with {fields}: the steps it published and its data position were made with "
            f"{'it' if len(changes) == 1 else 'them'}, and a resumed controller would wait for samples never "
            f"requested or train samples with settings they were not drawn with; {fix}")
