"""The parallel code path at degree 1 against today's plain path on one GPU (issue #34: "costs ≤ 2 %").

Two paths over the same random-weight SD3.5-Medium-sized transformer (`benchmarks.gpu.model`, 2.24 B parameters,
bf16; big enough that kernel launches do not dominate), each timed in interleaved repetitions (plain, parallel,
then parallel, plain, ...) until `--budget-s` is spent:

- rollout denoise: `--steps` Euler steps of `--batch` samples at `--size`² under `no_grad`.
  (a) plain: the adapter's `velocity`, as a rollout worker of one rank calls it.
  (b) parallel, every degree 1: the replica's ranks joined as a process group of one rank (`join_replica`:
      NCCL), the models split per `RolloutLayoutSpec(ulysses=1, tensor=1, encoderTensor=1)` (`parallelize`: at
      degree 1 it leaves them whole), and every call made through the replica leader (`LeaderAdapter` over a
      `ReplicaChannel`: the command header over gloo and x, σ and the conditioning broadcast over NCCL before
      each forward), what a replica's rank 0 runs.
- actor update: one FlowGRPO update (`flow_grpo_step`: LoRA r32, KL reference, bypass mode, `--actor-samples`
  samples of a `--window`-step SDE window in micro-batches of `--micro-batch`, one AdamW step).
  (a) plain: `Ranks()` (one rank, no process group), as the trainer runs a one-rank actor.
  (b) parallel, every degree 1: `PolicySet.shard` over a one-rank group (`Ranks(world=1, ulysses=1)`): FSDP2
      `fully_shard` on every block and the root over a mesh of one rank (the unshard/reshard hooks, DTensor
      parameters, the all-gather per block and reduce-scatter of the gradients), the path the actor's ranks take.

Before timing, both paths compute the velocity of the same latents (closed check: `velocity_max_abs_diff_*`,
0 when the parallel path computes exactly the plain one's numbers). Written: `parallel_overhead_rollout_pct` and
`parallel_overhead_actor_pct` = 100·(median parallel / median plain − 1), the spread (the interquartile range of
the per-pair ratios, in %), every repetition's seconds, to `DIR/parallel-overhead.json`.

    python -m benchmarks.gpu.parallel_overhead --out DIR --budget-s 300   # one GPU
    python -m benchmarks.gpu.parallel_overhead --smoke --out DIR          # CPU, tiny model, gloo, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.gpu.common import sync
from benchmarks.gpu.model import SD35_MEDIUM, TINY, BenchSD3Adapter, build_transformer

OUT_NAME = "parallel-overhead.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _adapter(config: dict, device: torch.device, dtype: torch.dtype, size: int) -> BenchSD3Adapter:
    """A fresh adapter over the transformer seeded 0: every call builds the same weights."""
    return BenchSD3Adapter(build_transformer(config, device, dtype, seed=0), resolution=(size, size))


def _latents(adapter, n: int, size: int, device: torch.device, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    c, h, w = adapter.latent_shape(adapter.tokenize(f"p @{size}"))
    return torch.randn(n, c, h, w, generator=g).to(device)


def _cond(adapter, n: int, size: int, device: torch.device) -> dict:
    return adapter.encode([adapter.tokenize(f"prompt {i} @{size}") for i in range(n)], device=device)


def denoise(adapter, x: torch.Tensor, cond: dict, steps: int) -> torch.Tensor:
    """`steps` Euler steps of the flow ODE from σ = 1 to 0 (`[B, C, H, W]` float32 in, out)."""
    sigmas = torch.linspace(1.0, 0.0, steps + 1, device=x.device)
    with torch.no_grad():
        for i in range(steps):
            v = adapter.velocity(x, sigmas[i].expand(x.shape[0]), cond)
            x = x + (sigmas[i + 1] - sigmas[i]) * v
    return x


def train_samples(adapter, n: int, window: int, size: int, seed: int = 0) -> list:
    """`n` synthetic FlowGRPO samples (a `window`-step SDE window of random latents, log-probs 0, advantages ±1)
    in groups of 2: what the update computes on does not depend on the values."""
    from omnirl.actor.batch import TrainSample

    g = torch.Generator().manual_seed(seed)
    c, h, w = adapter.latent_shape(adapter.tokenize(f"p @{size}"))
    sigmas = torch.linspace(0.9, 0.9 - 0.1 * window, window + 1)
    return [TrainSample(f"0:{i // 2}:{i}", str(i // 2), adapter.tokenize(f"prompt {i // 2} @{size}"),
                        1.0 if i % 2 else -1.0, torch.randn(c, h, w, generator=g),
                        torch.randn(window + 1, c, h, w, generator=g), torch.zeros(window), sigmas.clone(), 0.8, "cps")
            for i in range(n)]


class Actor:
    """One actor path: θ with LoRA, its reference, AdamW and the update (`parallel`: FSDP2 over a one-rank group)."""

    def __init__(self, adapter, *, parallel: bool, device: torch.device, micro_batch: int) -> None:
        from benchmarks.gpu.actor import grpo_spec
        from omnirl.actor.policy import PolicySet
        from omnirl.actor.ranks import SINGLE, Ranks
        from omnirl.api.spec import LoRASpec
        from omnirl.api.spec_algorithm import OptimizerSpec

        self.policies = PolicySet(adapter, LoRASpec(enabled=True, rank=32, alpha=64), need_ref=True, need_old=False)
        self.ranks = SINGLE
        if parallel:
            self.ranks = Ranks(0, 1, str(device), 1)
            self.policies.shard(self.ranks, getattr(adapter, "compile_block_types", None))
        self.optimizer = torch.optim.AdamW(self.policies.trainable_parameters(), lr=1e-6)
        self.spec, self.opt = grpo_spec("bypass"), OptimizerSpec(microBatchSize=micro_batch, updatesPerStep=1)
        self.device = device

    def update(self, samples: list) -> dict:
        from omnirl.actor.flow_grpo_update import flow_grpo_step

        return flow_grpo_step(self.policies, self.optimizer, samples, self.spec, self.opt, seed=0, step=0,
                              device=self.device, ranks=self.ranks)


def _timed(fn, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def interleaved(plain, parallel, device: torch.device, budget_s: float, min_reps: int, max_reps: int) -> dict:
    """Time `plain()` and `parallel()` alternately (pair i runs plain first when i is even, parallel first when
    odd: drift in clocks or temperature falls on both) until `budget_s` is spent (at least `min_reps` pairs, at
    most `max_reps`). One warm-up call of each first, not timed.

    Returns:
        `{"plain_s": [...], "parallel_s": [...], "median_plain_s", "median_parallel_s", "overhead_pct",
        "pair_ratio_pct": {"median", "p25", "p75", "min", "max"}, "pairs"}`; overhead_pct = 100·(median parallel /
        median plain − 1), pair ratios 100·(parallel_i / plain_i − 1).
    """
    plain(), parallel()
    sync(device)
    times: dict[str, list[float]] = {"plain_s": [], "parallel_s": []}
    start = time.perf_counter()
    i = 0
    while i < max_reps and (i < min_reps or time.perf_counter() - start < budget_s):
        order = [("plain_s", plain), ("parallel_s", parallel)]
        for key, fn in order if i % 2 == 0 else order[::-1]:
            times[key].append(_timed(fn, device))
        i += 1
    ratios = sorted(100 * (b / a - 1) for a, b in zip(times["plain_s"], times["parallel_s"], strict=True))
    q = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else [ratios[0]] * 3
    mp, mq = statistics.median(times["plain_s"]), statistics.median(times["parallel_s"])
    return {**times, "pairs": i, "median_plain_s": mp, "median_parallel_s": mq, "overhead_pct": 100 * (mq / mp - 1),
            "pair_ratio_pct": {"median": statistics.median(ratios), "p25": q[0], "p75": q[2], "min": ratios[0],
                               "max": ratios[-1]}}


def run(args) -> dict:
    """Both measurements (module docstring); the JSON row."""
    from omnirl.api.spec_parallel import RolloutLayoutSpec
    from omnirl.models.parallel.replica import join_replica, parallelize
    from omnirl.rollout.replica import LeaderAdapter, ReplicaChannel

    device = torch.device(args.device)
    if device.type == "cuda":  # an index: set_device and NCCL need one ("cuda" alone is refused)
        device = torch.device("cuda", device.index or 0)
        torch.cuda.set_device(device)
    config, dtype = (TINY, torch.float32) if args.smoke else (SD35_MEDIUM, torch.bfloat16)
    torch.manual_seed(0)
    join_replica(0, 1, "127.0.0.1", _free_port(), device)
    try:
        # rollout: one adapter; the parallel path is the replica leader's calls over the same module
        adapter = _adapter(config, device, dtype, args.size)
        layout = RolloutLayoutSpec(ulysses=1, tensor=1, encoderTensor=1)
        done = parallelize(adapter, layout, device)
        leader = LeaderAdapter(adapter, ReplicaChannel(device))
        x = _latents(adapter, args.batch, args.size, device, seed=1)
        cond = _cond(adapter, args.batch, args.size, device)
        with torch.no_grad():
            sigma = torch.full((args.batch,), 0.7, device=device)
            rollout_diff = float((leader.velocity(x, sigma, cond) - adapter.velocity(x, sigma, cond)).abs().max())
        rollout = interleaved(lambda: denoise(adapter, x, cond, args.steps), lambda: denoise(leader, x, cond, args.steps),
                              device, args.budget_s * 0.4, args.min_reps, args.max_reps)
        leader = adapter = cond = x = None  # freed before the actor's copies (the lambdas hold these names)
        # actor: two copies of the same weights, one FSDP2-sharded over the one-rank group
        plain = Actor(_adapter(config, device, dtype, args.size), parallel=False, device=device,
                      micro_batch=args.micro_batch)
        sharded = Actor(_adapter(config, device, dtype, args.size), parallel=True, device=device,
                        micro_batch=args.micro_batch)
        x = _latents(plain.policies.adapter, args.micro_batch, args.size, device, seed=2)
        sigma = torch.full((args.micro_batch,), 0.7, device=device)
        with torch.no_grad():
            c1 = _cond(plain.policies.adapter, args.micro_batch, args.size, device)
            c2 = _cond(sharded.policies.adapter, args.micro_batch, args.size, device)
            actor_diff = float((sharded.policies.adapter.velocity(x, sigma, c2)
                                - plain.policies.adapter.velocity(x, sigma, c1)).abs().max())
        samples = train_samples(plain.policies.adapter, args.actor_samples, args.window, args.size)
        actor = interleaved(lambda: plain.update(samples), lambda: sharded.update(samples), device,
                            args.budget_s * 0.6, args.min_reps, args.max_reps)
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    finally:
        import torch.distributed as dist

        dist.destroy_process_group()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {
        "device": name, "smoke": bool(args.smoke), "dtype": str(dtype).removeprefix("torch."),
        "model": "SD3.5-Medium-sized SD3Transformer2DModel, random weights" if not args.smoke else "TINY SD3",
        "parallelize": done,
        "parallel_overhead_rollout_pct": rollout["overhead_pct"],
        "parallel_overhead_actor_pct": actor["overhead_pct"],
        "velocity_max_abs_diff_rollout": rollout_diff, "velocity_max_abs_diff_actor": actor_diff,
        "rollout": {"batch": args.batch, "size": args.size, "steps": args.steps, **rollout},
        "actor": {"samples": args.actor_samples, "window": args.window, "micro_batch": args.micro_batch,
                  "lora_rank": 32, **actor},
        "peak_memory_gib": peak,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="directory of parallel-overhead.json")
    parser.add_argument("--budget-s", type=float, default=300.0, help="seconds of timed repetitions, both parts")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny model, gloo: the code path in seconds")
    parser.add_argument("--device", default=None, help="default: cuda (cpu with --smoke)")
    parser.add_argument("--batch", type=int, default=None, help="rollout samples per forward (8; smoke 2)")
    parser.add_argument("--size", type=int, default=None, help="image side in pixels (512; smoke 64)")
    parser.add_argument("--steps", type=int, default=None, help="Euler steps per denoise (10; smoke 2)")
    parser.add_argument("--actor-samples", type=int, default=None, help="samples per update (8; smoke 2)")
    parser.add_argument("--window", type=int, default=2, help="SDE window steps per sample")
    parser.add_argument("--micro-batch", type=int, default=None, help="micro-batch (4; smoke 1)")
    parser.add_argument("--min-reps", type=int, default=5)
    parser.add_argument("--max-reps", type=int, default=200)
    args = parser.parse_args(argv)
    small = args.smoke
    defaults = {"device": "cpu" if small else "cuda", "batch": 2 if small else 8, "size": 64 if small else 512,
                "steps": 2 if small else 10, "actor_samples": 2 if small else 8, "micro_batch": 1 if small else 4}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if small:
        args.budget_s, args.min_reps, args.max_reps = min(args.budget_s, 2.0), 2, min(args.max_reps, 3)
        torch.set_num_threads(1)
    row = run(args)
    out = Path(args.out) / OUT_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(row, indent=1))
    for part in ("rollout", "actor"):
        r = row[part]
        print(f"{part:8} plain {r['median_plain_s'] * 1e3:9.2f} ms  parallel {r['median_parallel_s'] * 1e3:9.2f} ms  "
              f"overhead {r['overhead_pct']:+6.2f} %  (pairs {r['pairs']}, IQR {r['pair_ratio_pct']['p25']:+.2f} .. "
              f"{r['pair_ratio_pct']['p75']:+.2f} %)  velocity diff {row[f'velocity_max_abs_diff_{part}']:.3g}",
              flush=True)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
