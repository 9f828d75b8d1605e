"""Rollout images/s: step-wise continuous batching vs static request batching (same engine, same
kernels, so the ratio measures the scheduler), on a uniform and a mixed workload.

Mixed = two image sizes (32×64 for ≤ 4 digits, 32×128 for 5) and two step counts (10 and 20),
arriving as groups of 8 in a shuffled order; uniform = one size, 10 steps. Runs on the CPU with
the built-in digits model (or `--device cuda`).

    python -m benchmarks.rollout_batching [--requests 256] [--max-batch 32] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from datetime import date
from pathlib import Path

import torch

from omnirl.models.registry import load_adapter
from omnirl.rollout.engine import RolloutEngine
from omnirl.rollout.types import SampleRequest


def workload(adapter, n: int, mixed: bool, seed: int = 0) -> list[SampleRequest]:
    """n requests in groups of 8 (one prompt per group), shuffled by group."""
    rng = random.Random(seed)
    groups = []
    for g in range(n // 8):
        digits = rng.choice([3, 4, 5]) if mixed else 4
        text = "".join(rng.choice("0123456789") for _ in range(digits))
        steps = rng.choice([10, 20]) if mixed else 10
        ids = tuple(adapter.tokenize(f'"{text}"'))
        groups.append([SampleRequest(f"{g}:{i}", text, ids, seed=g * 8 + i, num_steps=steps) for i in range(8)])
    return [r for grp in groups for r in grp]


def measure(adapter, reqs: list[SampleRequest], batching: str, max_batch: int, device: str,
            groups_per_step: int) -> dict:
    """Stream the requests in (`groups_per_step` groups of 8 join before every engine step, as
    the controller's requests arrive) and time until every sample is done."""
    engine = RolloutEngine(adapter, max_batch_size=max_batch, batching=batching, device=device)
    pending = list(reqs)
    n = 0
    t0 = time.perf_counter()
    while pending or engine.has_work():
        for r in pending[: 8 * groups_per_step]:
            engine.submit(r)
        pending = pending[8 * groups_per_step :]
        n += len(engine.step())
    seconds = time.perf_counter() - t0
    s = engine.stats
    return {"batching": batching, "images": n, "seconds": seconds, "images_per_second": n / seconds,
            "forwards": s.forwards, "mean_batch": s.mean_batch}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--groups-per-step", type=int, default=1, help="groups of 8 arriving per engine step")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    adapter = load_adapter("ocr-digits", "builtin", device=args.device)
    adapter.module.eval()
    rows = []
    with torch.no_grad():
        measure(adapter, workload(adapter, 16, True), "stepwise", args.max_batch, args.device, 1)  # warm-up
        for name, mixed in (("uniform", False), ("mixed", True)):
            reqs = workload(adapter, args.requests, mixed)
            for batching in ("static", "stepwise", "static", "stepwise"):  # interleaved: load drifts
                row = measure(adapter, reqs, batching, args.max_batch, args.device, args.groups_per_step)
                prev = next((r for r in rows if r["workload"] == name and r["batching"] == batching), None)
                if prev is None:
                    rows.append({"workload": name, **row})
                elif row["images_per_second"] > prev["images_per_second"]:
                    prev.update(row)  # best of two
    print(f"{'workload':9} {'batching':9} {'images/s':>9} {'forwards':>9} {'mean batch':>10}")
    for r in rows:
        print(f"{r['workload']:9} {r['batching']:9} {r['images_per_second']:9.1f} {r['forwards']:9d} {r['mean_batch']:10.1f}")
    ratio = {w: next(r for r in rows if r["workload"] == w and r["batching"] == "stepwise")["images_per_second"]
             / next(r for r in rows if r["workload"] == w and r["batching"] == "static")["images_per_second"]
             for w in ("uniform", "mixed")}
    print(f"step-wise / static: uniform {ratio['uniform']:.2f}x, mixed {ratio['mixed']:.2f}x")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{date.today()}-{args.device}-rollout-batching.json"
    path.write_text(json.dumps({"device": args.device, "threads": args.threads, "max_batch": args.max_batch,
                                "rows": rows, "speedup": ratio}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
