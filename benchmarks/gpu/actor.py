"""One FlowGRPO update on the GPU: image-steps/s and MFU, LoRA or full parameters, eager or compiled.

The batch is real rollout output (trajectories from the engine), so ratios, clipping and the KL
are what training sees. FLOPs are counted by `torch.utils.flop_counter.FlopCounterMode` on one
eager update (forward, backward, the KL reference forward and, in `recompute` mode, the old
log-prob forward — everything executed), then scaled by the number of samples; the compiled
update executes the same matrix products.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.gpu.common import compiled_graphs, mfu, timed
from omnirl.actor.batch import TrainSample
from omnirl.actor.flow_grpo_update import flow_grpo_step
from omnirl.actor.policy import PolicySet
from omnirl.algorithms import group_advantages
from omnirl.api.spec import LoRASpec
from omnirl.api.spec_algorithm import FlowGRPOSpec, OptimizerSpec
from omnirl.rollout.types import SampleResult


def train_samples(results: list[SampleResult], rewards: list[float]) -> list[TrainSample]:
    """Scored rollout results → `TrainSample`s with group advantages (group = the prompt)."""
    groups = sorted({r.request.prompt for r in results})
    gid = torch.tensor([groups.index(r.request.prompt) for r in results])
    adv = group_advantages(torch.tensor(rewards, dtype=torch.float32), gid).advantages
    return [TrainSample(r.request.sample_id, r.request.prompt, list(r.request.prompt_ids), float(a), r.x0, r.latents,
                        r.log_probs, r.sigmas, r.request.noise_level, r.request.sde_type)
            for r, a in zip(results, adv.tolist(), strict=True)]


def grpo_spec(mode: str) -> FlowGRPOSpec:
    """The FlowGRPO settings of `examples/ocr-flowgrpo.yaml` (CPS 0.8, clip 1e-3, KL 0.01)."""
    return FlowGRPOSpec(sdeType="cps", noiseLevel=0.8, clipRange=1e-3, klCoef=0.01,
                        rolloutCorrection={"mode": mode})


def measure_update(adapter, samples: list[TrainSample], *, lora: bool, mode: str, micro_batch: int,
                   device: torch.device, peak_tflops: float, repeats: int = 2, compile: bool = True) -> dict:
    """Eager then compiled FlowGRPO updates on `samples` (one optimiser step each).

    Returns image-steps/s (samples × window steps per second), MFU, FLOPs per update, peak
    memory and the compile warm-up, for both.
    """
    policies = PolicySet(adapter, LoRASpec(enabled=lora, rank=32, alpha=64), need_ref=True, need_old=False)
    optimizer = torch.optim.AdamW(policies.trainable_parameters(), lr=1e-6)
    spec, opt = grpo_spec(mode), OptimizerSpec(microBatchSize=micro_batch, updatesPerStep=1)
    window = int(samples[0].log_probs.shape[0])

    def update(batch: list[TrainSample]) -> dict:
        return flow_grpo_step(policies, optimizer, batch, spec, opt, seed=0, step=0, device=device)

    with FlopCounterMode(display=False) as counter:
        update(samples[:micro_batch])
    flops = counter.get_total_flops() / micro_batch * len(samples)
    out = {"lora": lora, "mode": mode, "samples": len(samples), "window": window, "micro_batch": micro_batch,
           "flops_per_update": flops,
           "trainable_parameters": sum(p.numel() for p in policies.trainable_parameters())}
    for label in ("eager", "compiled") if compile else ("eager",):
        if label == "compiled":
            graphs = compiled_graphs()
            _, warm = timed(lambda: (policies.compile(), update(samples)), device)
            out["compile_warmup_seconds"], out["compile_graphs"] = warm, compiled_graphs() - graphs
        else:
            update(samples)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        graphs = compiled_graphs()
        _, seconds = timed(lambda: [update(samples) for _ in range(repeats)], device)
        seconds /= repeats
        out[label] = {"seconds": seconds, "image_steps_per_second": len(samples) * window / seconds,
                      "mfu": mfu(flops, seconds, peak_tflops), "recompiles": compiled_graphs() - graphs,
                      "peak_memory_gb": torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else 0.0}
    return out
