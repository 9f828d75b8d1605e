"""`omnirl eval JOB.yaml [--checkpoint DIR] [--prompts FILE] [--sampling-steps N] [--sampler ode|sde] [--seed S]
[--out OUT] [--overwrite]`.

Samples every prompt as in-run validation does (its requests, the rollout engine, the job's σ
grid; defaults: the job's held-out prompts, `validation.numSteps` and `validation.seed`), scores
it with the weighted sum of the job's rewards, writes `OUT/grid.png` and `OUT/rewards.json` (an audio+video
job: `grid.png` is a contact sheet and `OUT/videos/NN.mp4` are MP4s with sound, `controller/media_files.py`), and
ends with one line `mean_reward=0.412 exact_match=0.180 n=256` (`exact_match`: the share of samples
whose text every OCR-rule reward read exactly; absent when the job has none). An OUT that already holds
an evaluation's `rewards.json` or `grid.png` is refused before the model loads unless `--overwrite`.

A judge the job runs (`reward[].server`) is served here as `omnirl run` serves it (same command, a
free port, log `OUT/logs/judge-R.log`; `reward/servers.py::serving`) and stopped at the end, so
`omnirl eval RUN/job.yaml` scores with the run's judge, not the run's URL of it (dead once it ended).

It samples on the CPU with the torch threads `omnirl run` gives the job's rollout worker there
(`api/runtime.py::cpu_role_threads`, or `OMNIRL_LOCAL_THREADS`) and in validation's batches
(`evaluate.sample_heldout`): on the machine a CPU run sampled on, its images are bitwise the run's
validation images and `mean_reward` is that step's `val_reward_mean` (another thread count may round
the fp32 GEMMs differently: measured on 2 cores, 3 threads moved the latents, 1 and 2 did not).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from safetensors import SafetensorError

from omnirl.api.errors import config_errors
from omnirl.api.exits import CONFIG_ERROR_EXIT, FAILED
from omnirl.api.loader import load_rljob
from omnirl.api.runtime import cpu_role_threads, fixed_local_threads, usable_cores
from omnirl.api.spec import GROUP_KINDS, RLJob
from omnirl.controller.data import check_prompts
from omnirl.controller.grid import save_image_grid, tile_caption
from omnirl.controller.media_files import write_media
from omnirl.evaluation.evaluate import SampleUnscored, evaluate
from omnirl.models.policy_io import check_owner, exported_from, load_policy, resolve_checkpoint
from omnirl.models.registry import adapter_options, check_model_path, load_adapter, load_tokenizer
from omnirl.reward.registry import check_api_keys, check_judges
from omnirl.reward.servers import JudgeFailed, check_local, serving
from omnirl.system import disk


def main(args: argparse.Namespace) -> int:
    """CLI adapter; returns 0, 1 when a sample cannot be scored, or `CONFIG_ERROR_EXIT` (4, as `omnirl run`)
    when a judge server of `spec.reward[i].server` exits or never answers (one line naming the field).
    Raises ValueError (FileNotFoundError) naming the flag for `--steps` (`omnirl run`'s training steps:
    refused, naming `--sampling-steps`), a bad --sampling-steps, --seed, --out or --prompts (missing, a
    directory, empty, or a line the model cannot tokenize), or a --checkpoint that is not one, is
    damaged, or belongs to another job or model family (`check_owner`), an --out that already holds an
    evaluation without --overwrite (`_check_not_overwriting`), or naming
    `spec.reward[i].server.command` / `.modelPath` / `.volume` when this machine cannot run that judge
    (`reward.servers.check_local`, before anything loads)."""
    if args.steps is not None:  # its name before 2026-12-03: `omnirl run --steps` counts training steps
        fix = f"for the denoising steps per sample pass --sampling-steps {args.steps}" if args.sampling_steps is None \
            else f"drop it (--sampling-steps {args.sampling_steps} sets the denoising steps per sample)"
        raise ValueError(f"--steps {args.steps}: omnirl eval trains nothing (--steps is omnirl run's number of "
                         f"training steps); {fix}")
    if args.sampling_steps is not None and args.sampling_steps < 2:
        raise ValueError(f"--sampling-steps {args.sampling_steps}: must be >= 2 (denoising steps per sample; "
                         "default spec.validation.numSteps)")
    if args.seed is not None and args.seed < 0:
        raise ValueError(f"--seed {args.seed}: must be >= 0")
    disk.check_writable(Path(args.out), purpose="grid.png and rewards.json")  # before minutes of sampling, not after
    job = load_rljob(args.job)
    spec = job.spec
    check_api_keys(spec.reward)  # before minutes of model loading and sampling
    check_local(job, by="omnirl eval")  # a judge server this machine cannot run: named now, not after loading
    # the manifest's problem first: no flag fixes it (a job with neither asked for --prompts, then refused it)
    if all(r.kind in GROUP_KINDS for r in spec.reward):  # each sample's mean reward came out 0, unscored
        raise ValueError(f"spec.reward: every reward is group-level ({', '.join(r.name for r in spec.reward)}), and "
                         "omnirl eval scores single samples; add a per-sample reward (e.g. kind ocr) to the manifest")
    if not args.prompts and not spec.data.validationPrompts:  # it was a TypeError traceback
        raise ValueError(f"--prompts: {args.job} has no spec.data.validationPrompts to sample by default; pass "
                         "--prompts FILE (one prompt per line)")
    check_judges(spec.reward)  # those with a url; a served one once it answers (`serving`)
    fix = "restore it, or pass an older OUT/checkpoints/step-* directory"
    if args.checkpoint:  # another job's checkpoint is refused as `omnirl export` refuses it, before the model loads
        ckpt = resolve_checkpoint(args.checkpoint)
        with config_errors(f"--checkpoint {args.checkpoint}", json.JSONDecodeError, fix=fix):
            state = json.loads((ckpt / "state.json").read_text())
        check_owner(job, ckpt, state, manifest="omnirl eval OUT/job.yaml")
    check_model_path(spec.model.family, spec.model.path)  # one line naming the field, before its tokenizer is read
    tokenize = load_tokenizer(spec.model.family, spec.model.path)
    if args.prompts:  # checked before minutes of model loading and sampling
        prompts = check_prompts(args.prompts, tokenize, "--prompts")
    else:  # what validation samples
        prompts = check_prompts(spec.data.validationPrompts, tokenize, "spec.data.validationPrompts",
                                spec.validation.maxPrompts)
    # after the inputs' checks (a stray ./eval-out must not hide a bad manifest), before the judge's log and
    # the model load
    _check_not_overwriting(Path(args.out), args.overwrite)
    try:
        with serving(job, Path(args.out) / "logs", by="omnirl eval") as wired:
            return _evaluate(args, wired, prompts, fix)
    except JudgeFailed as err:  # the user's command exited or never listened: its line, not a traceback
        print(f"omnirl eval: {err}; nothing written", file=sys.stderr, flush=True)  # one line: field, why, fix
        return CONFIG_ERROR_EXIT  # as `omnirl run` for the same judge: a setting it cannot start with


OUTPUTS = ("rewards.json", "grid.png")  # what an evaluation writes into --out (an audio+video job: videos/ too)


def _means(components: list[dict[str, float]]) -> dict[str, float]:
    """Each reward's mean over the samples that have it."""
    names = dict.fromkeys(k for c in components for k in c)
    return {k: float(sum(c[k] for c in components if k in c) / sum(1 for c in components if k in c)) for k in names}


def _check_not_overwriting(out: Path, overwrite: bool) -> None:
    """Refuse an `out` that already holds an evaluation's outputs (`OUTPUTS`) unless `overwrite`: a second
    `omnirl eval --out DIR` replaced the first one's scores without a word.

    Raises:
        ValueError: one line naming the existing file and the two fixes (another --out, or --overwrite).
    """
    if overwrite:
        return
    for name in OUTPUTS:
        if (out / name).exists():
            raise ValueError(f"--out {out}: already holds an evaluation ({out / name}); pass another --out to keep "
                             "it, or --overwrite to replace it")


def _export_fix(export: Path) -> str:
    """How to score an export's weights: its directory as `spec.model.path`, or `--checkpoint` of the checkpoint
    it was exported from when `export.json` names one that is on this machine. `--checkpoint EXPORT` itself is
    refused (an export holds no `policy.safetensors`), so a bare "or pass --checkpoint" sent users into that."""
    source = exported_from(export)
    fix = f"set spec.model.path: {export}"
    return fix + (f", or pass --checkpoint {source} (the checkpoint it was exported from)" if source else "")


def _evaluate(args: argparse.Namespace, job: RLJob, prompts: list[str], fix: str) -> int:
    """Load the model, sample and score `prompts` with `job`'s rewards (judges wired in), write the outputs."""
    spec = job.spec
    adapter = load_adapter(spec.model.family, spec.model.path, dtype=spec.model.dtype, **adapter_options(spec))
    if args.checkpoint:  # a truncated or corrupt file: one line naming the flag, not a traceback
        with config_errors(f"--checkpoint {args.checkpoint}", SafetensorError, json.JSONDecodeError, fix=fix):
            state = load_policy(adapter, args.checkpoint, spec.model.lora)
        print(f"checkpoint {args.checkpoint}: step {state.get('step')} policy_version {state.get('policy_version')}")
        # the directory itself, not `latest` as given: a run that goes on moves `latest`, and the record then lied
        scored = {"checkpoint": str(resolve_checkpoint(args.checkpoint)), "checkpoint_step": state.get("step"),
                  "policy_version": state.get("policy_version")}
    else:  # say which weights are scored: without --checkpoint it is the manifest's model, often the base one
        scored = {"checkpoint": None}
        print(f"model {spec.model.path} (spec.model.path; no --checkpoint)")
        export = Path(args.job).parent
        if (export / "export.json").is_file() and spec.model.path != str(export):
            # an export's job.yaml is the run's manifest as written: it names the model the run started from
            print(f"omnirl eval: note: {args.job} is an export's manifest as written, so this scores "
                  f"spec.model.path {spec.model.path} (the model the run started from), not the exported weights; "
                  f"to score those {_export_fix(export)}", file=sys.stderr, flush=True)
    adapter.module.eval()
    # the rollout worker's threads: another count may round the forwards differently (module docstring)
    torch.set_num_threads(fixed_local_threads() or cpu_role_threads("rollout", spec.pipeline.mode, usable_cores()))
    steps = spec.validation.numSteps if args.sampling_steps is None else args.sampling_steps
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            result = evaluate(adapter, spec, prompts, num_steps=steps, seed=args.seed, sampler=args.sampler)
    except SampleUnscored as err:  # a scorer's answer (a judge's error), not a bug: its line, no traceback
        print(f"omnirl eval: {err}; nothing written", file=sys.stderr, flush=True)
        return FAILED
    seconds = time.perf_counter() - t0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    n_grid = min(64, result.n)
    videos: list[str] = []
    if result.media is not None:  # a contact sheet (frames, loudness) as grid.png, and MP4s with sound
        captions = [f"{r:.2f} (" + " ".join(f"{k} {v:.2f}" for k, v in c.items()) + f")  {p}"
                    for r, c, p in zip(result.rewards, result.components, result.prompts, strict=True)]
        videos = write_media(result.media, out / "grid.png", out / "videos", captions)["videos"]
    else:
        captions = [tile_caption(p, r) for p, r in zip(result.prompts[:n_grid], result.rewards[:n_grid], strict=True)]
        save_image_grid(result.images[:n_grid], out / "grid.png", ncols=8, captions=captions)
    (out / "rewards.json").write_text(json.dumps({
        "mean_reward": result.mean_reward, "exact_match": result.exact_match, "n": result.n,
        # `denoising_steps`, not `steps`: beside a checkpoint's step it read as training steps (nothing read `steps`)
        "sampler": args.sampler, "denoising_steps": steps, "seconds": seconds, **scored,
        **({"videos": videos, "components": _means(result.components)} if result.media is not None else {}),
        "rewards": [float(r) for r in result.rewards], "prompts": result.prompts}, indent=1))
    print(f"grid {out / 'grid.png'}  ({seconds:.1f} s)")
    if result.media is not None:
        print(f"videos {out / 'videos'} ({len(videos)} MP4s with sound); per reward: "
              + " ".join(f"{k}={v:.3f}" for k, v in _means(result.components).items()))
    exact = "" if result.exact_match is None else f" exact_match={result.exact_match:.3f}"  # None: no text to match
    print(f"mean_reward={result.mean_reward:.3f}{exact} n={result.n}")
    return 0
