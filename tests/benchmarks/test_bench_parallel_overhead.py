"""`benchmarks/gpu/parallel_overhead.py` on the CPU (`--smoke`: tiny SD3, gloo): the parallel code path at degree 1
(a one-rank replica's leader; FSDP2 over a one-rank group) computes exactly the plain path's velocities, and the
JSON carries both overheads with their raw repetitions (the ≤ 2 % claim itself is the GPU run's,
benchmarks/README.md)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_smoke_run_writes_both_overheads_and_the_paths_agree(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "services"), str(ROOT / "operator"), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu.parallel_overhead", "--smoke", "--out",
                           str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads((tmp_path / "parallel-overhead.json").read_text())
    assert row["device"] == "cpu" and row["smoke"] is True
    assert row["parallelize"] == {"ulysses": 1, "tensor": 1, "encoder_layers": 0}
    # closed check: the same weights through either path give the same velocity, to the bit (float32, one rank)
    assert row["velocity_max_abs_diff_rollout"] == 0.0
    assert row["velocity_max_abs_diff_actor"] == 0.0
    for part in ("rollout", "actor"):
        r = row[part]
        assert r["pairs"] >= 2 and len(r["plain_s"]) == len(r["parallel_s"]) == r["pairs"]
        assert all(t > 0 for t in r["plain_s"] + r["parallel_s"])
        assert r["median_plain_s"] == statistics.median(r["plain_s"])
        expected = 100 * (statistics.median(r["parallel_s"]) / statistics.median(r["plain_s"]) - 1)
        assert row[f"parallel_overhead_{part}_pct"] == r["overhead_pct"] == expected
        ratios = r["pair_ratio_pct"]
        assert ratios["min"] <= ratios["p25"] <= ratios["median"] <= ratios["p75"] <= ratios["max"]
    assert "overhead" in proc.stdout and "wrote" in proc.stdout
