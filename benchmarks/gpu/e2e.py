"""One RL step end to end on one GPU: rollout → reward → FlowGRPO update → weight sync.

Two model copies on the device, as the rollout worker and the actor hold them (LoRA rank 32 on
both; the actor trains, then its adapter tensors are copied into the rollout copy — the
in-process equivalent of the weight sync, whose cross-process cost `weight_sync.py` measures).
Reward: JPEG compressibility (`omnirl.reward.jpeg`, CPU) of the 512² preview images.

Configurations:
- baseline: `sync` (score after the whole rollout) + `recompute` (an extra forward for the old
  log-probs) + static batching + eager kernels — how a diffusers-based FlowGRPO runs;
- baseline-compiled: the same with the compiled denoiser (isolates the scheduling/pipelining);
- omnirl: `async-reward` (each sample is scored the moment it finishes, on CPU threads, while the
  GPU keeps denoising) + `bypass` (the rollout's log-probs are the old ones) + step-wise
  batching + compiled denoiser.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
import torch

from benchmarks.gpu.actor import grpo_spec, train_samples
from benchmarks.gpu.common import compiled_graphs, timed
from benchmarks.gpu.model import BenchSD3Adapter, build_transformer
from omnirl.actor.flow_grpo_update import flow_grpo_step
from omnirl.actor.policy import PolicySet
from omnirl.api.spec import LoRASpec
from omnirl.api.spec_algorithm import OptimizerSpec
from omnirl.models.compile import compile_adapter_module
from omnirl.models.lora import lora_tensors, prepare_rollout_module
from omnirl.reward.jpeg import JPEGCompressibilityScorer
from omnirl.rollout.engine import RolloutEngine
from omnirl.rollout.types import SampleRequest

CONFIGS = {
    "baseline": {"reward": "sync", "mode": "recompute", "batching": "static", "compile": False},
    "baseline-compiled": {"reward": "sync", "mode": "recompute", "batching": "static", "compile": True},
    "omnirl": {"reward": "async", "mode": "bypass", "batching": "stepwise", "compile": True},
}


class UpsampledPreview(BenchSD3Adapter):
    """The bench adapter with previews at image resolution (8× nearest), so rewards see 512² images."""

    def decode(self, x0):
        return super().decode(x0).repeat_interleave(8, dim=1).repeat_interleave(8, dim=2)


def step_requests(adapter, step: int, prompts: int, group: int, side: int, steps: int) -> list[SampleRequest]:
    """One step's requests: `prompts` groups of `group`; the SDE window (3 steps in the first 6) shared by the step."""
    start = random.Random(step).randrange(0, 4)
    out = []
    for p in range(prompts):
        ids = tuple(adapter.tokenize(f"step {step} prompt {p} @{side}"))
        out += [SampleRequest(f"{step}:{p}:{i}", f"prompt {p}", ids, seed=step * 10_000 + p * group + i,
                              num_steps=steps, window=tuple(range(start, start + 3)), noise_level=0.8,
                              sde_type="cps", shift=3.0) for i in range(group)]
    return out


def run_config(name: str, model_config: dict, device: torch.device, *, steps: int = 3, prompts: int = 8,
               group: int = 8, side: int = 512, denoise_steps: int = 10, max_batch: int = 32,
               micro_batch: int = 8) -> dict:
    """`steps` RL steps of configuration `name`; the first (warm-up, compilation) is reported apart."""
    c = CONFIGS[name]
    actor = UpsampledPreview(build_transformer(model_config, device))
    rollout = UpsampledPreview(build_transformer(model_config, device))
    lora = LoRASpec(enabled=True, rank=32, alpha=64)
    policies = PolicySet(actor, lora, need_ref=True, need_old=False)
    prepare_rollout_module(rollout, lora)
    if c["compile"]:
        policies.compile()
        compile_adapter_module(rollout)
    optimizer = torch.optim.AdamW(policies.trainable_parameters(), lr=1e-6)
    spec, opt = grpo_spec(c["mode"]), OptimizerSpec(microBatchSize=micro_batch, updatesPerStep=1)
    engine = RolloutEngine(rollout, max_batch_size=max_batch, batching=c["batching"], device=device)
    scorer = JPEGCompressibilityScorer()
    pool = ThreadPoolExecutor(max_workers=8)
    target = lora_tensors(rollout.module)
    rows = []
    for step in range(steps):
        graphs = compiled_graphs()
        reqs = step_requests(rollout, step, prompts, group, side, denoise_steps)
        for r in reqs:
            engine.submit(r)

        def rollout_and_reward():
            results, futures = [], []
            while engine.has_work():
                done = engine.step()
                results += done
                if c["reward"] == "async":
                    futures += [pool.submit(scorer.score, r.image.numpy()[None], [r.request.prompt],
                                            [r.request.sample_id]) for r in done]
            if c["reward"] == "async":
                rewards = [float(f.result()[0]) for f in futures]
            else:
                rewards = scorer.score(np.stack([r.image.numpy() for r in results]), [r.request.prompt for r in results],
                                       [r.request.sample_id for r in results]).tolist()
            return results, rewards

        (results, rewards), t_rollout = timed(rollout_and_reward, device)
        samples = train_samples(results, rewards)
        metrics, t_train = timed(partial(flow_grpo_step, policies, optimizer, samples, spec, opt, seed=0, step=step,
                                         device=device), device)
        _, t_sync = timed(partial(_weight_sync, policies, target, engine, step + 1), device)
        rows.append({"step": step, "seconds": t_rollout + t_train + t_sync, "rollout_reward_seconds": t_rollout,
                     "train_seconds": t_train, "sync_seconds": t_sync, "images": len(results),
                     "recompiles": compiled_graphs() - graphs, "loss": metrics["loss"],
                     "ratio_max_abs_dev": metrics["ratio_max_abs_dev"]})
    pool.shutdown()
    timed_rows = rows[1:]
    out = {"config": name, **c, "steps": rows, "warmup_step_seconds": rows[0]["seconds"],
           "step_seconds": sum(r["seconds"] for r in timed_rows) / len(timed_rows),
           "rollout_reward_seconds": sum(r["rollout_reward_seconds"] for r in timed_rows) / len(timed_rows),
           "train_seconds": sum(r["train_seconds"] for r in timed_rows) / len(timed_rows),
           "sync_seconds": sum(r["sync_seconds"] for r in timed_rows) / len(timed_rows)}
    return out


def _weight_sync(policies: PolicySet, target: dict, engine: RolloutEngine, version: int) -> None:
    """The actor's adapter tensors into the rollout copy (in place), then the new policy version."""
    with torch.no_grad():
        for k, v in policies.rollout_tensors().items():
            target[k].copy_(v)
    engine.set_policy_version(version)
