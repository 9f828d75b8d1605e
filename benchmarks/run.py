"""`make bench`: every benchmark that runs on this machine, one after another.

Results are printed as tables with ratios and written to `benchmarks/results/`. On a CUDA machine
the GPU suite (`benchmarks.gpu.run`: SD3.5-Medium-sized rollout, compile variants, actor, end to
end, weight sync; about 25 minutes on one H200) runs first. See benchmarks/README.md.
"""

from __future__ import annotations

import subprocess
import sys

import torch

BENCHES = [
    ["benchmarks.rollout_batching", "--requests", "256"],
    ["benchmarks.weight_sync_cpu"],
    ["benchmarks.pipeline_modes", "--steps", "6"],
    ["benchmarks.transfer_overhead"],
    ["benchmarks.transfer_load"],
]


def main() -> int:
    benches = list(BENCHES)
    if torch.cuda.is_available():
        benches.insert(0, ["benchmarks.gpu.run", "--sections", "rollout,compile,actor,e2e,sync"])
        benches.insert(1, ["benchmarks.gpu.service", "--configs", "omnirl,baseline,omnirl-2gpu"])
    for bench in benches:
        print(f"\n=== {' '.join(bench)}", flush=True)
        rc = subprocess.call([sys.executable, "-m", *bench])
        if rc != 0:
            print(f"{bench[0]} failed with exit code {rc}", flush=True)
            return rc
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
