"""`make bench`: every benchmark that runs on this machine, one after another.

Results are printed as tables with ratios and written to `benchmarks/results/`. On a CUDA machine
the rollout-batching benchmark also runs on the GPU.
"""

from __future__ import annotations

import subprocess
import sys

import torch

BENCHES = [
    ["benchmarks.rollout_batching", "--requests", "256"],
    ["benchmarks.weight_sync_cpu"],
    ["benchmarks.pipeline_modes", "--steps", "6"],
]


def main() -> int:
    benches = list(BENCHES)
    if torch.cuda.is_available():
        benches.insert(1, ["benchmarks.rollout_batching", "--device", "cuda", "--requests", "1024", "--max-batch", "128"])
    for bench in benches:
        print(f"\n=== {' '.join(bench)}", flush=True)
        rc = subprocess.call([sys.executable, "-m", *bench])
        if rc != 0:
            print(f"{bench[0]} failed with exit code {rc}", flush=True)
            return rc
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
