"""The manifest in a run's exports is the one the user wrote: a judge the job runs stays a
`reward[].server`, so `omnirl eval EXPORT/job.yaml` serves that judge again and scores with it.

Found on the user's path: `omnirl run` of a job whose judge it starts (`server: omnirl scorer serve
…`) wrote `OUT/exports/latest/job.yaml` from the manifest the roles read, with the URL of this run's
judge (`url: http://127.0.0.1:58103/v1/score`, `server: null`), dead once the run ended; `omnirl eval
OUT/exports/latest/job.yaml --checkpoint OUT/checkpoints/latest` then failed, exit 2: `spec.reward[0].url:
the scorer at http://127.0.0.1:58103/v1/score does not answer (ConnectionRefusedError …)`. On Kubernetes
the export held the `J-judge-R` Service URL, gone with the RLJob (`tests/operator/test_judges.py`).
Now the launcher names `OUT/job.yaml` (the operator its ConfigMap's `manifest.yaml`) in
`OMNIRL_MANIFEST`, and the controller exports that (`controller/loop.py::written_manifest`).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from omnirl.api.errors import ConfigError
from omnirl.api.loader import load_rljob
from omnirl.api.runtime import RoleEnv
from omnirl.controller.loop import written_manifest
from omnirl.scorers.judges import wire

ROOT = Path(__file__).resolve().parents[2]
JUDGE = {"command": [sys.executable, "-m", "omnirl.cli", "scorer", "serve", "--reward", "ocr", "--protocol", "http",
                     "--host", "127.0.0.1", "--port", "{port}"], "urlPath": "/v1/score", "healthPath": "/healthz"}


def manifest(tmp: Path) -> Path:
    """The FlowGRPO example, 1 step of 2 prompts × 3, checkpointed (so exported); its one reward the
    OCR reward served by a judge the job runs; validation on 4 held-out prompts."""
    doc = yaml.safe_load((ROOT / "examples" / "ocr-flowgrpo.yaml").read_text())
    doc["metadata"]["name"] = "export-judge"
    spec = doc["spec"]
    spec["data"] = {"trainPrompts": str(ROOT / "examples/prompts/ocr-train.txt"),
                    "validationPrompts": str(ROOT / "examples/prompts/ocr-heldout.txt")}
    algo = spec["algorithm"]
    algo.update(steps=1, groupSize=3, promptsPerStep=2, sampling={"numSteps": 4})
    algo["flowGrpo"]["window"] = {"size": 2, "range": [0, 3]}
    algo["optimizer"] = {"learningRate": 1e-4, "microBatchSize": 4, "updatesPerStep": 1}
    spec["validation"] = {"everySteps": 1, "numSteps": 4, "maxPrompts": 4}
    spec["checkpoint"] = {"everySteps": 1, "keep": 1}
    spec.pop("transferQueue", None)  # the launcher's own redis-server
    spec["reward"] = [{"name": "judge", "kind": "http", "server": JUDGE}]
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def cli(*args: str, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omnirl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_the_export_keeps_the_judge_server_and_eval_of_it_serves_the_judge(tmp_path):
    out = tmp_path / "out"
    run = cli("run", str(manifest(tmp_path)), "--out", str(out), "--no-ray", timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    roles = yaml.safe_load((out / "job-roles.yaml").read_text())["spec"]["reward"][0]
    assert roles["server"] is None and roles["url"].startswith("http://127.0.0.1:")  # what the roles ran with

    export = out / "exports" / "latest"
    for path in (export / "job.yaml", out / "exports" / "step-000000" / "job.yaml"):
        reward = yaml.safe_load(path.read_text())["spec"]["reward"][0]
        assert reward["url"] is None, f"{path} holds the run's judge URL {reward['url']}"
        assert reward["server"]["command"] == JUDGE["command"] and reward["server"]["urlPath"] == "/v1/score"
    assert load_rljob(export / "job.yaml") == load_rljob(out / "job.yaml")  # the manifest as written, one text

    # eval of the export's manifest, as a user of the export runs it: the judge is served again, then stopped
    ev = cli("eval", str(export / "job.yaml"), "--checkpoint", str(out / "checkpoints" / "latest"),
             "--out", str(tmp_path / "eval"), timeout=300)
    assert ev.returncode == 0, ev.stdout + ev.stderr
    pid = int(re.search(r"omnirl: judge judge starting on port \d+ \(pid (\d+);", ev.stdout)[1])
    assert not Path(f"/proc/{pid}").exists(), f"the judge eval started (pid {pid}) outlived it"
    version = json.loads((export / "export.json").read_text())["policy_version"]
    (val,) = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
              if r["event"] == "validation" and r["policy_version"] == version]
    got = json.loads((tmp_path / "eval" / "rewards.json").read_text())
    assert (version, got["n"]) == (1, 4)
    assert abs(got["mean_reward"] - val["val_reward_mean"]) < 1e-6, (got, val)  # the run's judge, the run's number


def test_a_manifest_of_another_job_is_refused_naming_the_variable(tmp_path):
    """OMNIRL_MANIFEST must be the --job file's job as written: an export of other settings would describe
    a run that never was."""
    written = load_rljob(manifest(tmp_path))
    wired = wire(written, {"judge": "http://127.0.0.1:1/v1/score"})
    other = tmp_path / "other.yaml"
    doc = yaml.safe_load((tmp_path / "job.yaml").read_text())
    doc["spec"]["seed"] = 5
    other.write_text(yaml.safe_dump(doc))
    env = RoleEnv(job_name="export-judge", redis_url="redis://r/0", weight_sync_host="h", weight_sync_port=1,
                  worker_id="c", out_dir=str(tmp_path), manifest=str(other))
    with pytest.raises(ConfigError) as info:
        written_manifest(wired, env)
    assert str(info.value) == (f"OMNIRL_MANIFEST={other}: it is not the manifest of the job's --job file: spec.seed "
                               "differs; OMNIRL_MANIFEST is the job's manifest as written, next to the --job file; "
                               "the launcher (omnirl run) or the operator sets it")
    assert written_manifest(wired, replace(env, manifest=str(tmp_path / "job.yaml"))) == written
    assert written_manifest(wired, replace(env, manifest="")) == wired  # unset: the --job file
