"""`omnirl eval JOB.yaml [--checkpoint DIR] --prompts FILE --steps N [--sampler ode|sde]`.

Samples every prompt (ODE by default; `sde` = the Flow-GRPO SDE on every step but the last, noise
level from the job), scores it with the job's first reward, writes `OUT/grid.png` and
`OUT/rewards.json`, and ends with one line `mean_reward=0.412 exact_match=0.180 n=256`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from omnirl.api.loader import load_rljob
from omnirl.controller.data import read_prompts
from omnirl.controller.evaluate import EvalResult, eval_seed, evaluate
from omnirl.controller.grid import save_image_grid
from omnirl.models.policy_io import load_policy
from omnirl.models.protocol import ModelAdapter
from omnirl.models.registry import load_adapter
from omnirl.reward.base import Scorer
from omnirl.reward.registry import build_scorer
from omnirl.rollout.engine import RolloutEngine
from omnirl.rollout.types import SampleRequest


def evaluate_sde(adapter: ModelAdapter, scorer: Scorer, prompts: list[str], *, num_steps: int, noise_level: float,
                 sde_type: str, seed: int) -> EvalResult:
    """Like `evaluate`, with SDE sampling on steps 0..N-2 (what FlowGRPO rollouts look like)."""
    engine = RolloutEngine(adapter, max_batch_size=64)
    for i, p in enumerate(prompts):
        engine.submit(SampleRequest(f"eval:{i}", p, tuple(adapter.tokenize(p)), seed=eval_seed(seed, i),
                                    num_steps=num_steps, window=tuple(range(num_steps - 1)),
                                    noise_level=noise_level, sde_type=sde_type, meta={"i": i}))
    results = sorted(engine.run_until_idle(), key=lambda r: r.request.meta["i"])
    images = [r.image.numpy() for r in results]
    rewards = np.zeros(len(prompts), dtype=np.float32)
    by_shape: dict[tuple, list[int]] = {}
    for i, im in enumerate(images):
        by_shape.setdefault(im.shape, []).append(i)
    for idx in by_shape.values():
        rewards[idx] = scorer.score(np.stack([images[i] for i in idx]), [prompts[i] for i in idx],
                                    [f"eval:{i}" for i in idx])
    return EvalResult(float(rewards.mean()), float((rewards == 1.0).mean()), len(prompts), rewards, images, prompts)


def main(args: argparse.Namespace) -> int:
    """CLI adapter; returns 0."""
    job = load_rljob(args.job)
    spec = job.spec
    adapter = load_adapter(spec.model.family, spec.model.path, dtype=spec.model.dtype)
    if args.checkpoint:
        state = load_policy(adapter, args.checkpoint, spec.model.lora)
        print(f"checkpoint {args.checkpoint}: step {state.get('step')} policy_version {state.get('policy_version')}")
    adapter.module.eval()
    scorer = build_scorer(spec.reward[0])
    prompts = read_prompts(args.prompts)
    seed = spec.validation.seed if args.seed is None else args.seed
    t0 = time.perf_counter()
    with torch.no_grad():
        if args.sampler == "ode":
            result = evaluate(adapter, scorer, prompts, num_steps=args.steps, seed=seed)
        else:
            g = spec.algorithm.flowGrpo
            result = evaluate_sde(adapter, scorer, prompts, num_steps=args.steps, noise_level=g.noiseLevel,
                                  sde_type=g.sdeType, seed=seed)
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
