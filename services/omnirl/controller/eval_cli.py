"""`omnirl eval JOB.yaml [--checkpoint DIR] --prompts FILE --steps N [--sampler ode|sde]`.

Samples every prompt (ODE by default; `sde` = the Flow-GRPO SDE step with the job's
`flowGrpo.noiseLevel` when its sdeType is `sde`, else Flow-GRPO's default 0.7), scores it with the job's first reward, writes `OUT/grid.png` and
`OUT/rewards.json`, and ends with one line `mean_reward=0.412 exact_match=0.180 n=256`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from omnirl.api.loader import load_rljob
from omnirl.controller.data import read_prompts
from omnirl.controller.evaluate import evaluate
from omnirl.controller.grid import save_image_grid
from omnirl.models.policy_io import load_policy
from omnirl.models.registry import adapter_options, load_adapter
from omnirl.reward.registry import build_scorer


def main(args: argparse.Namespace) -> int:
    """CLI adapter; returns 0. Raises ValueError naming the flag for a bad --steps or --seed."""
    if args.steps < 1:
        raise ValueError(f"--steps {args.steps}: must be >= 1 (ODE sampler steps)")
    if args.seed is not None and args.seed < 0:
        raise ValueError(f"--seed {args.seed}: must be >= 0")
    job = load_rljob(args.job)
    spec = job.spec
    adapter = load_adapter(spec.model.family, spec.model.path, dtype=spec.model.dtype, **adapter_options(spec))
    if args.checkpoint:
        state = load_policy(adapter, args.checkpoint, spec.model.lora)
        print(f"checkpoint {args.checkpoint}: step {state.get('step')} policy_version {state.get('policy_version')}")
    adapter.module.eval()
    scorer = build_scorer(spec.reward[0])
    prompts = read_prompts(args.prompts)
    seed = spec.validation.seed if args.seed is None else args.seed
    t0 = time.perf_counter()
    with torch.no_grad():
        g = spec.algorithm.flowGrpo
        noise = g.noiseLevel if g.sdeType == "sde" else 0.7  # a CPS noise level means something else
        result = evaluate(adapter, scorer, prompts, num_steps=args.steps, seed=seed, sampler=args.sampler,
                          noise_level=noise)
    seconds = time.perf_counter() - t0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    n_grid = min(64, result.n)
    save_image_grid(result.images[:n_grid], out / "grid.png", ncols=8,
                    captions=[f"{r:.2f}" for r in result.rewards[:n_grid]])
    (out / "rewards.json").write_text(json.dumps({
        "mean_reward": result.mean_reward, "exact_match": result.exact_match, "n": result.n,
        "sampler": args.sampler, "steps": args.steps, "seconds": seconds, "checkpoint": args.checkpoint,
        "rewards": [float(r) for r in result.rewards], "prompts": result.prompts}, indent=1))
    print(f"grid {out / 'grid.png'}  ({seconds:.1f} s)")
    print(f"mean_reward={result.mean_reward:.3f} exact_match={result.exact_match:.3f} n={result.n}")
    return 0
