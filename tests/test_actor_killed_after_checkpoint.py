"""An actor SIGKILLed after it wrote a step's scheduled checkpoint but before it broadcast the weights and
published the step's result: its successor resumes from that checkpoint, finds the step trained, and
publishes its result again — with the step's metrics (loss, KL), which it keeps in `kv:trained` from the
moment the step is trained.

Before the fix the result was noted only after the broadcast, so the successor published a result without
metrics and the step's line in `metrics.jsonl` had no loss (`omnirl run`, this test: step 1's line held
only the controller's numbers; `e2e/test_survive_local.py` lost the line altogether when the controller
restarted too)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from e2e.chaos import chaos_job, check_ledger

ROOT = Path(__file__).resolve().parents[1]

# imported first by the role processes (sitecustomize on PYTHONPATH): the actor's first scheduled checkpoint
# written in a live step (step 1: everySteps 2) is its last act — SIGKILL before the broadcast
KILL_AFTER_CHECKPOINT = '''
import os, signal, sys
if "role" in sys.argv and "actor" in sys.argv:
    from omnirl.actor.service import ActorService
    save, marker = ActorService._save, os.environ["OMNIRL_TEST_MARKER"]
    def save_then_die(self, step, data_position, gathered=False):
        path = save(self, step, data_position, gathered=gathered)
        if gathered and step == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            print("test hook: SIGKILL after the checkpoint of step 1", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return path
    ActorService._save = save_then_die
'''


@pytest.mark.timeout(600)
def test_an_actor_killed_between_checkpoint_and_broadcast_keeps_the_steps_metrics(tmp_path):
    """`omnirl run` (real redis-server and role processes), 2 sync steps of 2 groups of 3, checkpoint every
    2 steps: the actor dies right after step 1's checkpoint. The run finishes; both steps' lines carry the
    actor's loss and KL; the ledger: 12 trained, nothing lost or duplicated; the actor restarted once."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_AFTER_CHECKPOINT)
    job, out = chaos_job(tmp_path, "killed-after-ckpt", steps=2), tmp_path / "out"
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["pipeline"] = {"mode": "sync"}
    job.write_text(yaml.safe_dump(doc))
    paths = [str(hook), str(ROOT / "services"), str(ROOT / "operator"), str(ROOT)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "OMNIRL_TEST_MARKER": str(tmp_path / "killed")}
    done = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", str(job), "--no-ray", "--device", "cpu",
                           "--out", str(out)], capture_output=True, text=True, timeout=540, cwd=ROOT, env=env)
    console = done.stdout + done.stderr
    assert done.returncode == 0, console[-3000:]
    assert (tmp_path / "killed").exists(), console[-3000:]  # the fault happened

    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert [(e["role"], e["action"]) for e in events] == [("actor-0", "restart-job")], events
    lines = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["event"] == "step"]
    assert [r["step"] for r in lines] == [0, 1]
    for r in lines:  # before the fix step 1's line had no loss: its result was published again without metrics
        assert isinstance(r.get("loss"), float) and isinstance(r.get("kl"), float), r
    counts = check_ledger(out, total_steps=2, group_size=3, prompts_per_step=2)
    assert (counts.lost, counts.duplicated, counts.trained, counts.problems) == (0, 0, 12, [])
