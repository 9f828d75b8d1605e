"""`python -m benchmarks.by_minute run … --smoke`: the by-minute benchmark of the audio+video task end to end, shrunk
to seconds: one `omnirl run` pinned to one core, its validations' held-out sum and four terms at each mark in the
result JSON, and the table rendered from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TERMS = ("ocr", "beeps", "pitch", "sync")


@pytest.mark.slow
@pytest.mark.omni
def test_by_minute_smoke_run_writes_each_term_at_each_mark(tmp_path):
    core = min(os.sched_getaffinity(0))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.by_minute", "run", "examples/avdigits-nft.yaml", "--smoke",
                           "--out", str(tmp_path / "nft"), "--cores", str(core), "--minutes", "10",
                           "--marks", "0", "10"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "nft.json").read_text())
    assert result["algorithm"] == "diffusion-nft" and result["smoke"] and result["cores"] == [core]
    assert result["exit_code"] == 0 and not result["stopped_at_limit"] and result["steps_done"] == 2
    assert [v["step"] for v in result["validations"]] == [0, 1, 2]
    start, end = result["marks"]
    assert start["step"] is None  # nothing is validated at the controller's first instant
    assert end["step"] == 2 and end["at_minutes"] <= 10 and set(end["terms"]) == set(TERMS)
    assert all(0.0 <= end["terms"][t] <= 1.0 for t in TERMS)
    assert end["reward"] == pytest.approx(sum(0.25 * end["terms"][t] for t in TERMS), abs=2e-4)  # weights 0.25
    table = subprocess.run([sys.executable, "-m", "benchmarks.by_minute", "table", str(tmp_path / "nft.json"),
                            "--include-smoke"], capture_output=True, text=True, timeout=120, cwd=ROOT, check=True).stdout
    assert f"|  | 10 | 2 (at {end['at_minutes']:.1f} min) | {end['reward']:.3f} |" in table
    assert table.count("not measured yet") == 6  # the other three algorithms
