"""`transferQueue.maxStreamLength`: the shortest stream `omnirl validate` accepts runs a job whose
groups are refilled.

The controller keeps a step's scores in their stream until the step is collected, a refilled
group's earlier attempts' scores too (acknowledged at hand-off; the stream is trimmed to the oldest
entry still pending). The bound was promptsPerStep × groupSize: a manifest at that bound passed
`omnirl validate`, and at the first refill the reward worker waited for room that only the step's
hand-off makes, the controller for the refilled scores: `omnirl run` stalled until the reward worker
was taken for hung (`reward-0: no progress for 32 s` → restart → the job failed).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from omnirl.api.exits import USAGE_EXIT
from omnirl.transfer.redis_server import free_port

ROOT = Path(__file__).resolve().parents[1]


def _validate(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omnirl.cli", "validate", str(path)], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow
def test_the_shortest_stream_validate_accepts_runs_a_job_whose_groups_are_all_refilled(tmp_path):
    port = free_port()
    scorer = subprocess.Popen([sys.executable, str(ROOT / "tests" / "refill_scorer.py"), "--port", str(port),
                               "--fail-attempts", "2"], stdout=subprocess.PIPE, text=True)
    try:
        assert scorer.stdout.readline().strip() == f"listening on {port}"
        doc = yaml.safe_load((ROOT / "examples" / "ocr-nft.yaml").read_text())
        spec = doc["spec"]
        spec["data"] = {"trainPrompts": str(ROOT / "examples" / "prompts" / "ocr-train.txt")}
        spec["algorithm"].update(promptsPerStep=3, groupSize=4)
        spec["reward"] = [{"name": "refill", "kind": "http", "url": f"http://127.0.0.1:{port}/v1/score"}]
        spec["failurePolicy"] = {"progressDeadlineSeconds": 30, "maxRestarts": 0}
        spec["transferQueue"] = {"maxStreamLength": 1}
        path = tmp_path / "job.yaml"
        path.write_text(yaml.safe_dump(doc))
        refused = _validate(path)
        said = refused.stdout + refused.stderr
        assert refused.returncode == USAGE_EXIT and "spec.transferQueue.maxStreamLength: 1 is invalid" in said, said
        shortest = int(re.search(r"must be >= (\d+)", said).group(1))
        spec["transferQueue"] = {"maxStreamLength": shortest}
        path.write_text(yaml.safe_dump(doc))
        assert _validate(path).returncode == 0
        proc = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", str(path), "--no-ray", "--device", "cpu",
                               "--steps", "2", "--out", str(tmp_path / "out")], capture_output=True, text=True,
                              timeout=600)
    finally:
        scorer.kill()
        scorer.wait()
    assert proc.returncode == 0, f"maxStreamLength {shortest}: " + proc.stdout[-3000:] + proc.stderr[-2000:]
    steps = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if s.get("event") == "step"]
    # every group of both steps was generated 3 times (refilled twice), none dropped, all 12 samples trained
    assert [(s["step"], s["refills"], s["dropped_groups"], s["samples"]) for s in steps] == [(0, 6, 0, 12),
                                                                                             (1, 6, 0, 12)]
