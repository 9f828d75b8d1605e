"""A checkpoint's policy in the form its users load, beside the manifest and the validation numbers.

What an export directory holds (safetensors and JSON only):

| run | files | load it with |
| --- | --- | --- |
| diffusers family, LoRA | `pytorch_lora_weights.safetensors` (LoRA config in its metadata) | `pipe.load_lora_weights(DIR)` |
| diffusers family, full weights | `transformer/config.json` + `transformer/diffusion_pytorch_model.safetensors` (`save_pretrained` layout) | `<Transformer>.from_pretrained(DIR/transformer)` |
| ocr-digits, av-digits (LoRA merged into the weights; `DigitsFamily` / `AVDigitsFamily.export_weights`) | `config.json` + `model.safetensors` (the built-in layout) | `load_digits_adapter(DIR)` / `load_avdigits_adapter(DIR)`, `model.path: DIR` |

and always `export.json` (what was exported, from which checkpoint), `job.yaml` (the run's
manifest as written: in a run, the controller's `written_manifest`, judges as `reward[].server`) and `validation.json` (this policy's validation, when the run validated it, and every
validation of the run up to it, from `metrics.jsonl`).

The policy exported is the checkpoint's `policy.safetensors`: the weights rollout sampled from
and validation scored (DiffusionNFT's old policy), so `validation.json` describes exactly these
weights. Full weights are hard-linked from the checkpoint when the file system allows (no copy).

Every export is written into a temporary sibling directory and renamed into place. In a run the
controller exports each checkpoint to `OUT/exports/step-NNNNNN/` and repoints `OUT/exports/latest`
(pruned like the checkpoints); `omnirl export` does the same for any checkpoint (`export_cli`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
import yaml
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from omnirl.api.errors import config_errors
from omnirl.api.loader import dump_rljob
from omnirl.api.run_dir import METRICS_FILE, read_metrics
from omnirl.api.spec import RLJob
from omnirl.models.diffusers._common import DIFFUSERS_WEIGHTS
from omnirl.models.families import get_family
from omnirl.models.policy_io import check_owner, publish, resolve_checkpoint
from omnirl.system.disk import readable, readable_as_umask_allows

EXPORT_FORMAT = "omnirl-export-v1"
EXPORTS = "exports"


def validations(run_dir: Path) -> list[dict]:
    """The `validation` records of `run_dir/metrics.jsonl`, in order ([] when there is none)."""
    if not (Path(run_dir) / METRICS_FILE).is_file():
        return []
    return [r for r in read_metrics(run_dir) if r.get("event") == "validation"]


def export_checkpoint(job: RLJob, checkpoint: str | Path, out: str | Path, *, run_dir: str | Path | None = None) -> Path:
    """Export `checkpoint` of `job` into the new directory `out` (written as a temporary sibling, then renamed).

    Args:
        job: the run's manifest (family, base model path, LoRA settings).
        checkpoint: a checkpoint directory, or a checkpoints root holding `latest`.
        out: the export directory; must not exist yet.
        run_dir: the run directory whose `metrics.jsonl` holds the validations (None: none).
    Returns:
        `out`.
    Raises:
        FileExistsError: `out` exists.
        FileNotFoundError: not a checkpoint, or the base model's files are missing.
        ValueError: the checkpoint's tensors do not fit the base model, or one of its files is
            truncated or corrupt (the message names the checkpoint).
    """
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} already exists; choose another --out or remove it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        ckpt = resolve_checkpoint(checkpoint)
        with config_errors(f"checkpoint {ckpt}", SafetensorError, json.JSONDecodeError,
                           fix="restore it, or pass an older step-* directory with --checkpoint"):
            _write(job, ckpt, tmp, None if run_dir is None else Path(run_dir))
            readable_as_umask_allows(tmp)  # safetensors and diffusers write weights 0600
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def export_run_checkpoint(job: RLJob, run_dir: str | Path, checkpoint: str | Path, keep: int) -> Path:
    """Export `checkpoint` to `run_dir/exports/<its name>/`, repoint `exports/latest`, keep `keep` + latest.

    Written aside and published by `policy_io.publish` (fsynced; an export of the same step already
    there, e.g. the last step exported again by a restarted controller, stays until the new one is in
    place: it was deleted first, and a crash during the export left `latest` naming nothing).

    Returns:
        The export directory (`<name>.K` when `latest` named `<name>` already). Raises as
        `export_checkpoint`.
    """
    root = Path(run_dir) / EXPORTS
    name = resolve_checkpoint(checkpoint).name
    for stale in root.glob(".tmp-*"):  # a killed export's leftovers (one writer: the controller)
        shutil.rmtree(stale, ignore_errors=True)
    staged = export_checkpoint(job, checkpoint, root / f".tmp-{name}-{os.getpid()}-staged", run_dir=run_dir)
    return publish(root, staged, root / name, keep)


def _write(job: RLJob, ckpt: Path, out: Path, run_dir: Path | None) -> None:
    spec = job.spec
    state = json.loads((ckpt / "state.json").read_text())
    check_owner(job, ckpt, state, manifest="--job")
    lora = bool(state.get("lora"))  # the manifest agrees (`check_owner`)
    policy = ckpt / "policy.safetensors"
    family = get_family(spec.model.family)
    files = family.export_weights(job, policy, lora, out, state)
    (out / "job.yaml").write_text(yaml.safe_dump(dump_rljob(job), sort_keys=False))
    version = int(state["policy_version"])
    history = [v for v in validations(run_dir) if int(v["policy_version"]) <= version] if run_dir else []
    mine = [v for v in history if int(v["policy_version"]) == version]
    (out / "validation.json").write_text(json.dumps(
        {"policy_version": version, "validation": mine[-1] if mine else None, "history": history}, indent=1) + "\n")
    manifest = {
        "format": EXPORT_FORMAT, "job": job.metadata.name, "family": spec.model.family, "base_model": spec.model.path,
        "algorithm": spec.algorithm.name, "step": int(state["step"]), "policy_version": version,
        "checkpoint": str(ckpt), "weights": "lora" if lora and not family.merges_lora else "full",
        "lora": {"rank": spec.model.lora.rank, "alpha": spec.model.lora.alpha,
                 "merged": family.merges_lora} if lora else None,
        "files": sorted(files + ["job.yaml", "validation.json"]),
    }
    (out / "export.json").write_text(json.dumps(manifest, indent=1) + "\n")


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link `src` to `dst` (checkpoint files are never rewritten in place), else copy it."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def tensor_keys(files: list[Path]) -> set[str]:
    """The tensor names of the safetensors `files` (headers only)."""
    keys: set[str] = set()
    for f in files:
        with safe_open(str(readable(f)), framework="pt") as handle:
            keys.update(handle.keys())
    return keys


def same_keys(got: set[str], want: set[str], what: str) -> None:
    """Raise ValueError naming the first missing and unexpected names when a policy's tensors are not `what`'s."""
    missing, unexpected = sorted(want - got), sorted(got - want)
    if missing or unexpected:
        raise ValueError(f"the checkpoint's policy does not fit {what}: missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]} (wrong model.family or model.path?)")


def merge_lora(base: dict[str, torch.Tensor], adapters: dict[str, torch.Tensor], alpha: float
               ) -> dict[str, torch.Tensor]:
    """W ← W + (alpha / r)·B·A for every peft LoRA pair `X.lora_A.default.weight` [r, in],
    `X.lora_B.default.weight` [out, r] over base weight `X.weight` [out, in] (float32 math).

    Raises:
        ValueError: a LoRA pair without its base weight, or tensors left unpaired.
    """
    merged = {k: v.float().clone() for k, v in base.items()}
    a_names = [k for k in adapters if ".lora_A." in k]
    if 2 * len(a_names) != len(adapters):
        raise ValueError(f"{len(adapters)} LoRA tensors do not form {len(a_names)} lora_A/lora_B pairs")
    for a_name in a_names:
        module = a_name.split(".lora_A.")[0]
        a, b = adapters[a_name].float(), adapters[a_name.replace(".lora_A.", ".lora_B.")].float()
        if f"{module}.weight" not in merged:
            raise ValueError(f"LoRA on {module!r}, which the base model has no weight for (wrong model.path?)")
        merged[f"{module}.weight"] += (alpha / a.shape[0]) * (b @ a)
    return {k: v.contiguous() for k, v in merged.items()}


def diffusers_lora(pipeline: str, job: RLJob, policy: Path, out: Path) -> list[str]:
    """A LoRA checkpoint's adapters as `out/pytorch_lora_weights.safetensors` through `<pipeline>.save_lora_weights`
    (a diffusers family's `export_weights`)."""
    from omnirl.models.diffusers.lora_io import WEIGHT_NAME, diffusers_lora_state, save_lora_state

    lora = job.spec.model.lora
    state = diffusers_lora_state(load_file(str(readable(policy))).items())
    save_lora_state(pipeline, state, lora.rank, lora.alpha, out)
    return [WEIGHT_NAME]


def diffusers_full(job: RLJob, policy: Path, out: Path) -> list[str]:
    """The transformer's `save_pretrained` layout: the base's config.json + the policy's weights."""
    base = Path(job.spec.model.path) / "transformer"
    config = base / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{config} not found: model.path must be the run's diffusers model directory "
                                "(with transformer/config.json)")
    shards = sorted(base.glob("diffusion_pytorch_model*.safetensors"))
    same_keys(tensor_keys([policy]), tensor_keys(shards), f"the transformer in {base}")
    (out / "transformer").mkdir()
    shutil.copyfile(config, out / "transformer" / "config.json")
    link_or_copy(policy, out / "transformer" / DIFFUSERS_WEIGHTS)
    return ["transformer/config.json", f"transformer/{DIFFUSERS_WEIGHTS}"]
