"""Rollout-vs-actor |Δ log_prob| per denoising step, with and without classifier-free guidance.

The rollout engine records each SDE transition's log-prob while it samples (step-wise batching:
a sample's batch companions change from step to step); the actor recomputes the same transitions
in its own micro-batches (`window_log_probs`, FlowGRPO's `recompute` mode). With identical
arithmetic the two agree exactly; in bf16 the matrix kernels depend on the batch shape, so they
do not. The gap per step is what FlowGRPO's clip range (1e-4 … 1e-5) must be compared with.

Layouts measured for each CFG scale:
- `stepwise`: the production layout — step-wise engine (max batch `--rollout-batch`, requests
  joining one per forward), actor micro-batches of `--micro-batch` samples.
- `matched`: static rollout batches of exactly the actor's micro-batches (same samples, same
  order): every GEMM sees the same shapes, so what is left is non-determinism, not layout.

Usage (on the benchmark GPU; SD3.5-Medium-sized transformer, random weights, bf16):
    python -m benchmarks.gpu.logprob_mismatch                      # CFG 1 and 4.5, prints JSON
    python -m benchmarks.gpu.logprob_mismatch --compile            # compiled blocks, as jobs run by default
    python -m benchmarks.gpu.logprob_mismatch --tiny --dtype float32   # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from benchmarks.gpu.fused_gelu import fuse_feedforward_gelu, unfuse_feedforward_gelu
from benchmarks.gpu.model import SD35_MEDIUM, TINY, BenchSD3Adapter, build_transformer
from omnirl.actor.batch import TrainSample, micro_batches
from omnirl.actor.flow_grpo_update import window_log_probs
from omnirl.algorithms import per_step_abs_log_ratio
from omnirl.models.compile import compile_adapter_module
from omnirl.rollout.engine import RolloutEngine
from omnirl.rollout.types import SampleRequest

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def make_requests(adapter, n: int, num_steps: int, window: tuple[int, ...], resolution: int,
                  noise_level: float, sde_type: str, cfg: float) -> list[SampleRequest]:
    """`n` requests over n/4 prompts (4 samples each), every one with the same SDE window."""
    out = []
    for i in range(n):
        ids = tuple(adapter.tokenize(f"prompt {i // 4} @{resolution}"))
        out.append(SampleRequest(sample_id=f"0:{i // 4}:{i % 4}", prompt=f"prompt {i // 4}", prompt_ids=ids, seed=i,
                                 num_steps=num_steps, window=window, noise_level=noise_level, sde_type=sde_type,
                                 guidance_scale=cfg))
    return out


def rollout(adapter, reqs: list[SampleRequest], layout: str, rollout_batch: int, micro_batch: int,
            device: torch.device) -> list[TrainSample]:
    """Generate `reqs` in the layout's batching; returns them as actor samples, in request order."""
    if layout == "matched":  # static batches = the actor's micro-batches, in order
        engine = RolloutEngine(adapter, max_batch_size=micro_batch, batching="static", device=device)
        for r in reqs:
            engine.submit(r)
        results = engine.run_until_idle()
    else:  # step-wise, one request joining per forward: companions change every step
        engine = RolloutEngine(adapter, max_batch_size=rollout_batch, batching="stepwise", device=device)
        results = []
        for r in reqs:
            engine.submit(r)
            results += engine.step()
        results += engine.run_until_idle()
    by_id = {r.request.sample_id: r for r in results}
    return [TrainSample(q.sample_id, q.sample_id.rsplit(":", 1)[0], list(q.prompt_ids), 0.0, by_id[q.sample_id].x0,
                        by_id[q.sample_id].latents, by_id[q.sample_id].log_probs, by_id[q.sample_id].sigmas,
                        q.noise_level, q.sde_type) for q in reqs]


@torch.no_grad()
def actor_log_probs(adapter, samples: list[TrainSample], micro_batch: int, device: torch.device) -> torch.Tensor:
    """`[B, W]` the actor's recomputed log-probs (micro-batches of `micro_batch`, request order)."""
    out = [window_log_probs(adapter, mb, device).float().cpu() for mb in micro_batches(samples, micro_batch)]
    return torch.cat(out)


def measure(adapter, args, cfg: float, layout: str, device: torch.device) -> dict:
    """Per-step mean and max |Δ log_prob|, overall mean/max/p99, and the steps measured."""
    adapter.guidance_scale = float(cfg)
    window = tuple(range(args.num_steps - 1))  # every step but the last (never trained)
    reqs = make_requests(adapter, args.requests, args.num_steps, window, args.resolution, args.noise_level,
                         args.sde_type, cfg)
    fused = fuse_feedforward_gelu(adapter.module) if args.fused_gelu else 0  # the experiment, not the product
    samples = rollout(adapter, reqs, layout, args.rollout_batch, args.micro_batch, device)
    if fused:  # the actor's GELU stays unfused (its backward needs the pre-activation)
        unfuse_feedforward_gelu(adapter.module)
    actor = actor_log_probs(adapter, samples, args.micro_batch, device)
    rollout_lp = torch.stack([s.log_probs.float() for s in samples])
    gap = (actor.double() - rollout_lp.double()).abs()
    return {
        "cfg": cfg, "layout": layout, "rollout_fused_gelus": fused, "steps": list(window),
        "per_step_mean_abs": per_step_abs_log_ratio(actor, rollout_lp).tolist(),
        "per_step_max_abs": gap.max(dim=0).values.tolist(),
        "mean_abs": float(gap.mean()), "max_abs": float(gap.max()), "p99_abs": float(torch.quantile(gap.flatten(), 0.99)),
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu.logprob_mismatch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="small transformer (CPU smoke test)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="weights and compute dtype")
    p.add_argument("--cfg", default="1.0,4.5", help="comma-separated CFG scales (1 = no CFG; default %(default)s)")
    p.add_argument("--layouts", default="stepwise,matched", help="comma-separated from: stepwise, matched")
    p.add_argument("--requests", type=int, default=32, help="samples (4 per prompt)")
    p.add_argument("--num-steps", type=int, default=10, help="denoising steps (all but the last are measured)")
    p.add_argument("--resolution", type=int, default=512, help="image side in pixels")
    p.add_argument("--rollout-batch", type=int, default=16, help="step-wise engine's max batch")
    p.add_argument("--micro-batch", type=int, default=8, help="actor micro-batch")
    p.add_argument("--noise-level", type=float, default=0.8)
    p.add_argument("--sde-type", choices=["sde", "cps"], default="cps")
    p.add_argument("--fused-gelu", action="store_true",
                   help="rollout with its feed-forward GELUs fused (benchmarks/gpu/fused_gelu.py, an experiment the "
                        "product does not run), actor unfused")
    p.add_argument("--compile", action="store_true",
                   help="regionally compiled blocks for rollout and actor, as `spec.model.compile` (the default) runs them")
    p.add_argument("--out", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    bad = sorted(set(args.layouts.split(",")) - {"stepwise", "matched"})
    if bad:
        p.error(f"unknown --layouts {bad}; choose from stepwise, matched")
    if args.num_steps < 2 or args.requests < 1:
        p.error("--num-steps must be >= 2 and --requests >= 1")
    return args


def main(argv: list[str] | None = None) -> dict:
    """Run every (CFG, layout) and return the report (also printed as JSON)."""
    args = parse(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = TINY if args.tiny else SD35_MEDIUM
    adapter = BenchSD3Adapter(build_transformer(config, device, DTYPES[args.dtype]),
                              resolution=(args.resolution, args.resolution))
    if args.compile:  # one compiled module for both sides: rollout and the actor's recompute run no-grad graphs
        compile_adapter_module(adapter)
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "dtype": args.dtype, "model": "tiny" if args.tiny else "sd3.5-medium",
              "resolution": args.resolution, "requests": args.requests, "rollout_batch": args.rollout_batch,
              "micro_batch": args.micro_batch, "compiled": args.compile, "sde_type": args.sde_type, "noise_level": args.noise_level,
              "runs": [measure(adapter, args, float(c), layout, device)
                       for c in args.cfg.split(",") for layout in args.layouts.split(",")]}
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
