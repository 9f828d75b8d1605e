"""Golden curves of the built-in audio+video task: two short, deterministic runs of the shipped av-digits model in
one process (the rollout engine, the four rewards, group advantages and the actor's `Trainer`, as the roles call
them) reproduce their committed per-step numbers (tests/golden/avdigits-*.jsonl).

- FlowGRPO with classifier-free guidance 2 on both modalities and both in the policy: its rollouts' joint
  log-probs, the PPO loss and each reward term move when the audio is left out of the log-prob, the audio/video
  split moves, or guidance reaches one modality only.
- DiffusionNFT with video and audio weighted 3:1: its loss moves when the per-modality weights are dropped.

Regenerate on purpose with `GOLDEN_UPDATE=1 pytest tests/models/test_avdigits_golden.py` and say why in the commit.
One CPU thread, so the sums' order is the same on every machine; compared within float32 rounding.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from omnirl.actor.batch import TrainSample
from omnirl.actor.trainer import Trainer
from omnirl.algorithms import group_advantages
from omnirl.algorithms.plan import planner_for
from omnirl.api.loader import job_from_dict
from omnirl.api.seeds import derive
from omnirl.models.registry import adapter_options, load_adapter
from omnirl.reward.scoring import RewardSet
from omnirl.rollout.engine import RolloutEngine
from omnirl.rollout.types import SampleRequest
from omnirl.transfer.media import to_numpy

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
PROMPTS = ['A sign that says "42" with 2 beeps', 'A sign that says "907" with 3 beeps']
REWARDS = [{"name": n, "kind": f"avdigits-{k}", "weight": 0.25}
           for n, k in (("ocr", "ocr"), ("beeps", "beeps"), ("pitch", "pitch"), ("sync", "sync"))]
RUNS = {
    "flowgrpo-cfg": {"model": {"family": "av-digits"},
                     "algorithm": {"name": "flow-grpo", "steps": 2, "groupSize": 4, "promptsPerStep": 2,
                                   "sampling": {"numSteps": 6, "guidanceScale": 2.0},
                                   "optimizer": {"learningRate": 1e-4, "microBatchSize": 8},
                                   "flowGrpo": {"window": {"size": 2, "range": [0, 3]}, "klCoef": 0.01}}},
    "nft-weights": {"model": {"family": "av-digits", "modalities": {"video": {"weight": 3.0}, "audio": {"weight": 1.0}}},
                    "algorithm": {"name": "diffusion-nft", "steps": 2, "groupSize": 4, "promptsPerStep": 2,
                                  "sampling": {"numSteps": 6},
                                  "optimizer": {"learningRate": 1e-4, "microBatchSize": 8},
                                  "nft": {"klCoef": 0.01}}},
}


def run_curve(name: str) -> list[dict]:
    """Per training step: each reward term's mean, the sum's, the rollouts' mean joint log-prob (FlowGRPO) and the
    update's loss metrics."""
    job = job_from_dict({"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": f"golden-{name}"},
                         "spec": {**RUNS[name], "data": {"trainPrompts": "unused.txt"}, "reward": REWARDS}})
    spec, algo = job.spec, job.spec.algorithm
    rollout = load_adapter("av-digits", "builtin", **adapter_options(spec))
    trainer = Trainer(load_adapter("av-digits", "builtin", **adapter_options(spec)), spec)
    rewards = RewardSet(spec.reward)
    plan_of = planner_for(algo.name).rollout
    curve = []
    for step in range(algo.steps):
        plan = plan_of(algo, window_seed=derive(spec.seed, "window", step=step))
        engine = RolloutEngine(rollout, max_batch_size=8)
        for p, prompt in enumerate(PROMPTS):
            for i in range(algo.groupSize):
                engine.submit(SampleRequest(f"{step}:{p}:{i}", prompt, tuple(rollout.tokenize(prompt)),
                                            seed=derive(spec.seed, "sample", step=step, group=p, sample=i),
                                            num_steps=algo.sampling.numSteps, window=plan.window,
                                            noise_level=plan.noise_level, sde_type=plan.sde_type,
                                            meta={"group": f"{step}:{p}"}))
        with torch.no_grad():
            results = sorted(engine.run_until_idle(), key=lambda r: r.request.sample_id)
        scored = rewards.score([r.image.numpy() for r in results], [r.request.prompt for r in results],
                               [r.request.sample_id for r in results], [to_numpy(r.media) for r in results])
        totals = torch.tensor([s[0] for s in scored], dtype=torch.float32)
        groups = torch.tensor([int(r.request.meta["group"].split(":")[1]) for r in results])
        adv = group_advantages(totals, groups, std_mode=algo.advantage.stdMode).advantages
        samples = [TrainSample(r.request.sample_id, r.request.meta["group"], list(r.request.prompt_ids), float(a),
                               r.x0, r.latents, r.log_probs, r.sigmas, plan.noise_level, plan.sde_type)
                   for r, a in zip(results, adv.tolist(), strict=True)]
        metrics = trainer.train_step(samples, step)
        rollout.module.load_state_dict(trainer.policies.rollout_adapter.module.state_dict())
        record = {"step": step, "reward": float(totals.mean())}
        record.update({f"reward_{n}": sum(s[1][n] for s in scored) / len(scored) for n in ("ocr", "beeps", "pitch", "sync")})
        if results[0].log_probs.numel():
            record["rollout_log_prob"] = float(torch.stack([r.log_probs for r in results]).mean())
        record.update({k: metrics[k] for k in ("loss", "kl", "policy_loss", "positive_loss", "negative_loss",
                                               "grad_norm") if k in metrics})
        curve.append(record)
    return curve


def same(got, want) -> bool:
    """Equal within float32 rounding (1e-5 relative or 1e-6 absolute)."""
    if isinstance(want, float) or isinstance(got, float):
        return got is not None and want is not None and math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-6)
    return got == want


@pytest.fixture()
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_audio_video_task_reproduces_its_golden_curve(name: str, one_thread) -> None:
    curve = run_curve(name)
    standard = GOLDEN / f"avdigits-{name}.jsonl"
    if os.environ.get("GOLDEN_UPDATE") == "1":
        standard.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in curve))
    expected = [json.loads(line) for line in standard.read_text().splitlines()]
    for got, want in zip(curve, expected, strict=True):
        moved = [k for k in sorted(set(got) | set(want)) if not same(got.get(k), want.get(k))]
        assert not moved, (f"{name}: the numbers moved at step {want['step']}; if on purpose, regenerate with "
                           "GOLDEN_UPDATE=1 and say why in the commit\n"
                           + "\n".join(f"  {k}: {want.get(k)} -> {got.get(k)}" for k in moved))
