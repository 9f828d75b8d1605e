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
validation, …) may change.

The model (`MODEL_FIXED`): the checkpoints hold the weights of one model in one layout. Measured with the
built-in model and LoRA rank 4 (`omnirl run` to step 2, then `--resume` with the changed manifest): rank 8
crashed the actor after loading (`RuntimeError: The size of tensor a (8) must match … b (4)`, exit 1) and the
launcher restarted the job until `failurePolicy.maxRestarts` (3 × 42 s); other `targetModules` or LoRA off
failed after loading (exit 4, "checkpoint tensors do not match the model"); another `alpha` or another
`model.path` (perturbed weights) trained on silently, the adapters scaled differently or on other base
weights. `compile`, `attention` and `gradientCheckpointing` shape nothing stored and may change.

`dtype` (`MODEL_NOTED`): the checkpoints hold the weights and AdamW's moments in the run's dtype, and a resume in
another loads them cast to it (`Tensor.copy_` into the parameters, `Optimizer.load_state_dict` casts the state to
each parameter's dtype; the multi-rank path `distribute_tensor(value.to(param.dtype))`). Measured with the
built-in model (`omnirl run` to step 2, 4 optimizer steps, then `--resume`): float32 → bfloat16 and back both
trained on (full weights and LoRA rank 4), the new checkpoints in the new dtype; float32 → bfloat16 rounds the
weights, by 15.5% of what training had changed them (the RMS of the rounding over that of the trained change:
less for a longer run, whose change is larger). Refusing it would not keep the precision: the fix would be a new
run from the export, loaded in bfloat16 the same way, without the optimizer state. Accepted, and said
(`resume_notes`).

The rewards (`reward_changes`): the scores already made for the pending steps were made by the run's
scorers. Another reward (added, removed, renamed), `kind`, `params` or `required` would mix scores of two
definitions in one step (measured: a `jpeg` reward added on resume trained a step whose 3 already-scored
samples lacked it, `component_missing_jpeg` 3). `weight` and `normalize` only combine stored components,
which the controller does per step from each sample's components (`controller/normalize.py::combine_step`):
accepted, and the pending steps' scores are combined with the new values (`resume_notes`; before, a step
half scored before the stop mixed both weights: weight 1 → 0.5 gave reward_mean 0.383 where 0.233 was
right).

The judge (`REWARD_FIXED`'s `url` and `server.*`): a remote reward's `url`, or the judge server the job runs
(`server`: its image, command line, model and path, also where `server.template`'s container `judge` sets its
image, command or args), is the scorer itself. Measured (`omnirl run` of an `http`
reward to step 1, then `--resume` with its `url` moved to another `omnirl scorer serve`, a JPEG one): accepted
without a word, and the train reward went 0.567 → -3.193 from the first resumed step. Refused like `params`;
a judge that only moved answers at the earlier URL too. How a judge is run and waited for (`REWARD_OPERATIONAL`:
`timeoutSeconds`, `server.replicas`, `port`, `healthPath`, `startupSeconds`, `accelerator`, the rest of `template`) scores
nothing differently: accepted, and said (`resume_notes`; it was accepted silently).

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
"""Dotted paths in the manifest (camelCase, as `loader.dump_rljob` writes it) a resume must keep: the
published steps and the data position."""

MODEL_FIXED: tuple[str, ...] = (
    "spec.model.family",
    "spec.model.path",
    "spec.model.lora.enabled",
    "spec.model.lora.rank",
    "spec.model.lora.alpha",
    "spec.model.lora.targetModules",
)
"""The model the checkpoints hold, and their layout; `lora.*` but `enabled` are compared only when LoRA is on
in both manifests (without it no adapter is stored)."""

MODEL_NOTED: tuple[str, ...] = ("spec.model.dtype",)
"""Model fields a resume accepts and says (`resume_notes`): the checkpoint loads cast to the new value."""

REWARD_JUDGE: tuple[str, ...] = ("url", "server.image", "server.command", "server.args", "server.modelPath",
                                  "server.volume", "server.urlPath", "server.template.judge")
"""Per `spec.reward[i]`: which judge scores it, the endpoint or the server the job runs (part of `REWARD_FIXED`);
`server.*` is compared only when both manifests run a server (a switch between `url` and `server` is a `url`
change). `server.template.judge` is the `image`, `command` and `args` that `server.template`'s container `judge`
sets over the generated ones (the rest of the template is `REWARD_OPERATIONAL`)."""

REWARD_FIXED: tuple[str, ...] = ("kind", "params", "required", *REWARD_JUDGE)
"""Per `spec.reward[i]` (matched by position, after the names): what defines the scores already made."""

REWARD_FREE: tuple[str, ...] = ("weight", "normalize")
"""Per `spec.reward[i]`: how the controller combines the stored components; accepted, and said (`resume_notes`)."""

REWARD_OPERATIONAL: tuple[str, ...] = ("timeoutSeconds", "server.replicas", "server.port", "server.healthPath",
                                       "server.startupSeconds", "server.accelerator", "server.template")
"""Per `spec.reward[i]`: how the scorer is run and waited for, not what it scores; accepted, and said
(`resume_notes`)."""

_ABSENT = object()


def _get(doc: Any, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(doc, dict) or key not in doc:
            return _ABSENT
        doc = doc[key]
    return doc


PATHS = frozenset({"spec.data.trainPrompts", "spec.model.path"})
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


def _lora_on(doc: Any) -> bool:
    return _get(doc, "spec.model.lora.enabled") is True


def _fields(before: dict[str, Any], now: dict[str, Any], paths: tuple[str, ...]) -> list[tuple[str, Any, Any]]:
    out = []
    for path in paths:
        if path.startswith("spec.model.lora.") and path != "spec.model.lora.enabled" and not (
                _lora_on(before) and _lora_on(now)):
            continue
        was, value = _get(before, path), _get(now, path)
        if was is not _ABSENT and value is not _ABSENT and not _same(path, was, value):
            out.append((path, was, value))
    return out


def _rewards(doc: Any) -> list[dict[str, Any]] | None:
    rewards = _get(doc, "spec.reward")
    return [r for r in rewards if isinstance(r, dict)] if isinstance(rewards, list) else None


def reward_changes(before: dict[str, Any], now: dict[str, Any], which: tuple[str, ...] = REWARD_FIXED
                   ) -> list[tuple[str, Any, Any]]:
    """The `spec.reward` entries' fields `which` (default `REWARD_FIXED`) that differ, as (field, before, now):
    first the list of names (a reward added, removed or renamed: `spec.reward[].name`), and only when the
    names agree each entry's fields (`spec.reward[i].params`). A manifest without `spec.reward` is not compared."""
    was, value = _rewards(before), _rewards(now)
    if was is None or value is None:
        return []
    names = [r.get("name") for r in was], [r.get("name") for r in value]
    if names[0] != names[1]:
        return [("spec.reward[].name", names[0], names[1])] if which == REWARD_FIXED else []
    out = []
    for i, (a, b) in enumerate(zip(was, value, strict=True)):
        for key in which:
            if key.startswith("server."):
                if not (isinstance(a.get("server"), dict) and isinstance(b.get("server"), dict)):
                    continue  # a server added or removed: `url` changed with it (the two are exclusive)
                a_, b_, key_ = a["server"], b["server"], key.removeprefix("server.")
            else:
                a_, b_, key_ = a, b, key
            if key_ == "template.judge":
                x, y = _judge_container(a_.get("template")), _judge_container(b_.get("template"))
            else:  # a field left out is its default: the dump writes every field, a hand-written ConfigMap may not
                x, y = a_.get(key_, _REWARD_DEFAULTS.get(key)), b_.get(key_, _REWARD_DEFAULTS.get(key))
            if x != y:
                out.append((f"spec.reward[{i}].{key}", x, y))
    return out


def _judge_container(template: Any) -> dict[str, Any]:
    """What a judge server's pod template sets over the generated container `judge` that changes the judge
    itself: its `image`, `command` and `args` ({} when it sets none; merged user fields win, api/podtemplate.py)."""
    spec = template.get("spec") if isinstance(template, dict) else None
    containers = spec.get("containers") if isinstance(spec, dict) else None
    for c in containers if isinstance(containers, list) else []:
        if isinstance(c, dict) and c.get("name") == "judge":
            return {k: c[k] for k in ("image", "command", "args") if k in c}
    return {}


_REWARD_DEFAULTS: dict[str, Any] = {"params": {}, "required": True, "weight": 1.0, "normalize": "none",
                                    "timeoutSeconds": 30.0, "server.args": [], "server.urlPath": "/",
                                    "server.replicas": 1, "server.port": 8000}


def resume_changes(before: dict[str, Any], now: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """The fields a resume must keep (`RESUME_FIXED`, `MODEL_FIXED`, the rewards' `REWARD_FIXED`) whose value
    differs between two manifests, as (field, before, now).

    Args:
        before: the manifest the run started with (a dict as `loader.dump_rljob` writes it, e.g. the run
            directory's `job.yaml` or the operator's ConfigMap); a field it lacks (an older file, another
            algorithm's block) is not compared.
        now: the manifest to resume with, in the same form.
    """
    return (_fields(before, now, RESUME_FIXED) + _fields(before, now, MODEL_FIXED)
            + reward_changes(before, now))


_WHY_STEPS = ("the steps it published and its data position were made with {it}, and a resumed controller would "
              "wait for samples never requested or train samples with settings they were not drawn with")
_WHY_MODEL = ("its checkpoints hold the weights of that model in that layout, which the actor cannot load into "
              "another (it fails after loading, or restarts until failurePolicy.maxRestarts) or would go on training "
              "on other base weights or at another adapter scale")
_WHY_REWARD = ("the scores already made for its pending steps come from {those} rewards, and a resumed step "
               "would mix them with scores of the new definition")
_WHY_JUDGE = ("{fields} name{s} the judge that scores the reward, and another judge (another model or version) would "
              "change the reward from the first resumed step without a word (a judge that only moved: make it "
              "answer at the earlier address too)")


def resume_conflict(before: dict[str, Any], now: dict[str, Any], *, where: str, fix: str) -> str | None:
    """One line naming every changed field a resume must keep (`resume_changes`) with both values, why each
    kind of field matters and `fix`; None when none changed. `where` names the run (`--resume: runs/x holds a
    run`, `RLJob x`)."""
    changes = resume_changes(before, now)
    if not changes:
        return None
    fields = ", ".join(f"{path} {was!r} (now {value!r})" for path, was, value in changes)
    steps = [c for c in changes if c[0] in RESUME_FIXED]
    model = [c for c in changes if c[0] in MODEL_FIXED]
    reward = [c for c in changes if c[0].startswith("spec.reward")]
    judge = [c[0] for c in reward if c[0].split("].", 1)[-1] in REWARD_JUDGE]
    why = ([_WHY_STEPS.format(it="it" if len(steps) == 1 else "them")] if steps else []) + (
        [_WHY_MODEL] if model else []) + ([_WHY_REWARD.format(those="those")] if len(reward) > len(judge) else []) + (
        [_WHY_JUDGE.format(fields=", ".join(judge), s="" if len(judge) > 1 else "s")] if judge else [])
    return f"{where} started with {fields}: {'; '.join(why)}; {fix}"


def _dtype_note(was: Any, now: Any) -> str:
    narrower = (was, now) == ("float32", "bfloat16")
    return (f"spec.model.dtype {was!r} → {now!r}: the checkpoint's weights and AdamW state load cast to {now}"
            + (" (rounded to 8 significant bits; measured on the built-in model after 4 optimizer steps: an error "
               "15% the size of what training had changed)" if narrower else "")
            + f", and training goes on in {now}")


def resume_notes(before: dict[str, Any], now: dict[str, Any]) -> str | None:
    """One line for the accepted changes of a resume, or None: the reward fields `REWARD_FREE` (`weight`,
    `normalize`: the controller combines each step's stored components with the manifest's values, so the
    scores already made for the pending steps count with the new ones, and `reward_mean` changes scale from
    the first resumed step), `REWARD_OPERATIONAL` (`timeoutSeconds`, the judge server's replicas, port, probes,
    placement: the resumed roles use the new values) and `MODEL_NOTED` (`dtype`: the checkpoint loads cast to
    the new dtype). Both
    manifests as for `resume_changes`; a field either lacks is not compared."""
    notes = []
    changes = reward_changes(before, now, REWARD_FREE)
    if changes:
        fields = ", ".join(f"{path} {was!r} → {value!r}" for path, was, value in changes)
        notes.append(f"{fields}: the scores already made for the pending steps are combined with the new "
                     f"value{'s' if len(changes) > 1 else ''} too (reward_mean changes scale from the first resumed "
                     "step)")
    changes = reward_changes(before, now, REWARD_OPERATIONAL)
    if changes:
        fields = ", ".join(f"{path} {was!r} → {value!r}" for path, was, value in changes)
        notes.append(f"{fields}: how a scorer is run and waited for, not what it scores (the resumed roles use the new "
                     f"value{'s' if len(changes) > 1 else ''})")
    notes += [_dtype_note(was, value) for _, was, value in _fields(before, now, MODEL_NOTED)]
    return "; ".join(notes) or None
