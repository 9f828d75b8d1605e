"""A role process (`omnirl role ROLE`, a real process against a real redis-server) that starts after the job's
controller wrote its `finish` record exits 0 at once with one line (`launch/roles.py::finished_record`).

Kubernetes restarts a pod that dies in place (Deployment, StatefulSet) and the operator's `restart-job` rolls
every role and makes a new controller Job; after the last step that ran the finished job again. Measured
through the operator and the stand-in kubelet (`e2e/test_kubernetes_finish.py`): the controller SIGKILLed
right after its `finish` line, the new controller met the old actor's state, started at step 3, exported the
last checkpoint again (`exports/step-000002.1`) and wrote a second `start` and `finish`. Here without the fix a
restarted rollout process loads its model and serves until a `stop` flag comes, and a controller waits for an
actor that never announces itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from omnirl.transfer.keys import kv_key
from omnirl.transfer.records import FINISHED

ROOT = Path(__file__).resolve().parents[2]
JOB = "finished-job"
STEPS = 3
RECORD = {"event": "finish", "time": 1796310179.8, "total_steps": STEPS, "start_step": 0,
          "last_checkpoint": "/run/checkpoints/step-000002", "last_export": "/run/exports/step-000002",
          "validation": None}


def _job(tmp_path: Path) -> Path:
    doc = yaml.safe_load((ROOT / "examples" / "ocr-flowgrpo.yaml").read_text())
    doc["metadata"]["name"] = JOB
    doc["spec"]["data"] = {"trainPrompts": str(ROOT / "examples/prompts/ocr-train.txt")}
    doc["spec"]["algorithm"]["steps"] = STEPS
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _role(tmp_path: Path, redis_url: str, role: str, timeout_s: float = 60.0, **extra: str
          ) -> tuple[subprocess.CompletedProcess, float]:
    """Run `omnirl role ROLE` as a pod runs it; returns the finished process and its wall-clock seconds."""
    env = {**os.environ, "OMNIRL_JOB_NAME": JOB, "OMNIRL_REDIS_URL": redis_url, "OMNIRL_OUT": str(tmp_path / "out"),
           "OMNIRL_WORKER_ID": f"{role}-0", "OMNIRL_DEVICE": "cpu", "OMNIRL_RESUME": "auto",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "services"), str(ROOT / "operator"), str(ROOT)]), **extra}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "omnirl.cli", "role", role, "--job", str(_job(tmp_path))],
                          capture_output=True, text=True, timeout=timeout_s, env=env, cwd=ROOT)
    return done, time.monotonic() - start


@pytest.mark.timeout(240)
@pytest.mark.parametrize("role", ["rollout", "reward", "actor", "controller"])
def test_a_role_started_after_the_finish_record_exits_0_at_once(tmp_path, redis_client, redis_url, role):
    """The job's `kv:finished` holds its `finish` record: the process exits 0 with that one line on stderr and
    nothing else (no torch set-up, no model load); a controller also sets the `stop` flag."""
    redis_client.set(kv_key(JOB, FINISHED), json.dumps(RECORD).encode())
    done, seconds = _role(tmp_path, redis_url, role)
    assert done.returncode == 0, done.stderr[-2000:]
    # the one line and nothing before it: not the "ROLE on cpu, N threads" of torch's set-up, nor a model load
    assert done.stderr.splitlines() == [
        f"omnirl role {role}: the job had finished (3 training steps; its controller wrote the finish record at "
        "2026-12-03 15:02:59 UTC): nothing to do, exiting 0"], done.stderr[-2000:]
    print(f"{role}: exit 0 after {seconds:.1f} s")
    assert (redis_client.get(kv_key(JOB, "stop")) is not None) == (role == "controller")


def test_a_controller_that_finds_its_finish_line_but_no_key_writes_both(tmp_path, redis_client, redis_url):
    """A controller killed between its `finish` line and `kv:finished`: its successor (same run directory)
    finds the line, writes the key and the `stop` flag (the other roles end as after any finish), exits 0."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"event": "start", "time": 1.0, "total_steps": STEPS, "start_step": 0}, RECORD)))
    done, _ = _role(tmp_path, redis_url, "controller")
    assert done.returncode == 0 and "the job had finished" in done.stderr, done.stderr[-2000:]
    assert json.loads(redis_client.get(kv_key(JOB, FINISHED))) == RECORD
    assert json.loads(redis_client.get(kv_key(JOB, "stop"))) is True
    assert (out / "metrics.jsonl").read_text().count('"finish"') == 1  # nothing written again


def test_a_run_resumed_for_more_steps_than_it_finished_is_not_finished(tmp_path, redis_client, redis_url):
    """`OMNIRL_STEPS` (a `--resume --steps 5` of the finished 3-step run) above the record's `total_steps`: the
    role starts as before, and the controller leaves the `stop` flag alone."""
    from omnirl.api.loader import load_rljob
    from omnirl.api.runtime import RoleEnv
    from omnirl.launch.roles import finished_record

    redis_client.set(kv_key(JOB, FINISHED), json.dumps(RECORD).encode())
    job = load_rljob(_job(tmp_path))
    env = RoleEnv(job_name=JOB, redis_url=redis_url, weight_sync_host="127.0.0.1", weight_sync_port=1,
                  worker_id="controller-0", out_dir=str(tmp_path / "out"))
    assert finished_record(job, env, "rollout") == RECORD
    assert finished_record(job, dataclasses.replace(env, steps=5), "rollout") is None
    assert finished_record(job, dataclasses.replace(env, steps=5), "controller") is None
    assert redis_client.get(kv_key(JOB, "stop")) is None
