"""A role SIGKILLed once at an exact point of its code, through `omnirl run` (real redis-server and role
processes, the local supervisor): the run must end as an uninterrupted one does.

The hook (a `sitecustomize.py` on the role processes' PYTHONPATH) wraps one method of one role and SIGKILLs
the process right before or after the call whose arguments match, once per run (a marker file). The kill
points found wanting so far:

- the controller killed after a checkpoint step's line, before that checkpoint's export (directly, or during
  the validation round that comes first): its successor started at the next step and never exported the
  checkpoint (`exports/latest` lagged `checkpoints/latest` until the next checkpoint; with `checkpoint.keep`
  2 the finished run had `exports/step-000002` only, an uninterrupted one also `step-000001`).

Tried by hand on 2026-12-03 with the same hook (3 steps, sync unless named), each ending as an uninterrupted
run (exit 0, one line per step with its loss, the same losses and rewards, ledger 18 trained, nothing lost or
duplicated), so not kept here: the actor after the weight broadcast before `_publish_state`, after
`_publish_state`, after `_publish_done` (steps 0, 1; also fully-async, and `restart-role`), after noting the
result before the checkpoint, inside `_forget_through`, in a replayed step, after a replay's checkpoint, in
`_announce`; the controller before and after publishing a `TrainRequest` (also async-reward, fully-async and
`restart-role`), before `expected:{step}`, before `_report`, after a step's line, after a validation round's
publish, before its `finish`, after its line, before and after the last export, after `finish`, after `stop`;
the rollout and reward roles right after a publish.

- the actor killed right after publishing its last step's result: the supervisor restarted the finished job
  (trained again from the last checkpoint, the export made again as `step-000002.1`) or, with `maxRestarts`
  spent, exited 137 ("the job did not finish") after printing the finished run's summary. Now a role that dies
  once the job no longer needs it is not restarted (`launch/supervise.py::_no_longer_needed`).
- the same with validation: the final round stalled (its rollout worker waited for the dead actor's weight-sync
  store, without beating): rollout-0 was killed for "no progress for 62 s" and, `maxRestarts: 0`, the run exited
  137. Now that actor is restarted alone, once (`launch/supervise.py::_final_round_needs`).
"""

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

# imported first by every process on PYTHONPATH; acts only in `omnirl role ROLE` processes of the kill's role
KILL_AT = '''
import importlib, json, os, signal, sys
def _install(kill):
    if "role" not in sys.argv or kill["role"] not in sys.argv:
        return
    module, attr = kill["target"].split(":")
    owner_name, name = attr.rsplit(".", 1)
    owner = getattr(importlib.import_module(module), owner_name)
    call = getattr(owner, name)
    def maybe_die(when, args, kwargs):
        if when != kill["when"] or os.path.exists(kill["marker"]) or not eval(kill["cond"], {}, {"args": args}):
            return
        open(kill["marker"], "w").close()
        print(f"test hook: SIGKILL {when} {kill['target']}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    def wrapped(*args, **kwargs):
        maybe_die("before", args, kwargs)
        result = call(*args, **kwargs)
        maybe_die("after", args, kwargs)
        return result
    setattr(owner, name, wrapped)
if os.environ.get("OMNIRL_TEST_KILL"):
    _install(json.loads(os.environ["OMNIRL_TEST_KILL"]))
'''

# name → (role, "module:Class.method", before/after, condition on the call's `args`, validation every N steps)
KILL_POINTS = {
    # the first export (step 1's checkpoint, checkpoint.everySteps 2) is never made by the killed controller
    "controller-before-export": ("controller", "omnirl.controller.loop:Controller._export", "before", "True", 0),
    # the validation round after step 1 (2 steps trained) comes before step 1's export
    "controller-in-validation-before-export": ("controller", "omnirl.controller.validation:Validator.publish",
                                               "after", "args[1] == 2", 2),
}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("point", sorted(KILL_POINTS))
def test_a_role_killed_at_an_exact_point_ends_as_an_uninterrupted_run(tmp_path, point):
    """3 sync steps of 2 groups of 3, checkpoints after steps 1 and 2 (`keep` 2): the run exits 0 with one
    restart-job, one line per step with the actor's loss, the validation rounds once each, both checkpoints
    exported (each once, no `.K` copy), and the ledger: 18 trained, nothing lost or duplicated."""
    role, target, when, cond, val_every = KILL_POINTS[point]
    out = _run_killed(tmp_path, (role, target, when, cond), val_every=val_every)
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert [(e["role"], e["action"]) for e in events] == [(f"{role}-0", "restart-job")], events
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    lines = [r for r in records if r["event"] == "step"]
    assert [r["step"] for r in lines] == [0, 1, 2]
    assert all(isinstance(r.get("loss"), float) for r in lines), lines
    rounds = [r["step"] for r in records if r["event"] == "validation"]
    assert rounds == ([0, 2, 3] if val_every else []), rounds
    # before the fix: ['latest', 'step-000002'] — step 1's checkpoint was never exported
    assert sorted(p.name for p in (out / "exports").iterdir()) == ["latest", "step-000001", "step-000002"]
    exported = json.loads((out / "exports" / "step-000001" / "export.json").read_text())
    assert exported["step"] == 1, exported
    if val_every:  # exported after the round of its weights, which it carries
        carried = json.loads((out / "exports" / "step-000001" / "validation.json").read_text())
        assert carried["validation"]["step"] == 2, carried
    counts = check_ledger(out, total_steps=3, group_size=3, prompts_per_step=2)
    assert (counts.lost, counts.duplicated, counts.trained, counts.problems) == (0, 0, 18, [])


def _run_killed(tmp_path: Path, kill_at: tuple[str, str, str, str], val_every: int = 0, max_restarts: int = 100,
                steps: int = 3) -> Path:
    """`omnirl run` of `steps` sync steps (checkpoints after steps 1 and 2, `keep` 2) with one role SIGKILLed at
    `kill_at` = (role, "module:Class.method", before/after, condition on `args`); asserts exit 0 and that the
    kill happened; returns the run directory."""
    role, target, when, cond = kill_at
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_AT)
    job, out = chaos_job(tmp_path, "crash-point", steps=steps), tmp_path / "out"
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["pipeline"] = {"mode": "sync"}
    doc["spec"]["checkpoint"]["keep"] = 2
    doc["spec"]["failurePolicy"]["maxRestarts"] = max_restarts
    if val_every:
        doc["spec"]["data"]["validationPrompts"] = str(ROOT / "examples/prompts/ocr-heldout.txt")
        doc["spec"]["validation"] = {"everySteps": val_every, "numSteps": 4, "maxPrompts": 2}
    job.write_text(yaml.safe_dump(doc))
    kill = {"role": role, "target": target, "when": when, "cond": cond, "marker": str(tmp_path / "killed")}
    paths = [str(hook), str(ROOT / "services"), str(ROOT / "operator"), str(ROOT)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "OMNIRL_TEST_KILL": json.dumps(kill)}
    done = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", str(job), "--no-ray", "--device", "cpu",
                           "--out", str(out)], capture_output=True, text=True, timeout=540, cwd=ROOT, env=env)
    console = done.stdout + done.stderr
    assert done.returncode == 0, console[-3000:]  # before the fix (maxRestarts 0): 137, "the job did not finish"
    assert (tmp_path / "killed").exists(), console[-3000:]  # the fault happened
    return out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_actor_killed_after_its_last_result_ends_the_job_without_a_restart(tmp_path):
    """The actor SIGKILLed right after publishing the last step's result, `maxRestarts: 0`: the job finishes
    (exit 0) once, its one event says the actor was not restarted, one start and one finish record, both
    checkpoints exported once (no `step-000002.1`), and the ledger: 18 trained, nothing lost or duplicated."""
    out = _run_killed(tmp_path, ("actor", "omnirl.actor.service:ActorService._publish_done", "after",
                                 "args[1].step == 2"), max_restarts=0)
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert [(e["role"], e["action"]) for e in events] == [
        ("actor-0", "not restarted (the job's last step, 2, was trained and reported: nothing is left for the actor)")
    ] or [(e["role"], e["action"]) for e in events] == [
        ("actor-0", "not restarted (the controller had ended the job)")], events
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records].count("start") == 1 and [r["event"] for r in records].count("finish") == 1
    assert [r["step"] for r in records if r["event"] == "step"] == [0, 1, 2]
    assert sorted(p.name for p in (out / "exports").iterdir()) == ["latest", "step-000001", "step-000002"]
    counts = check_ledger(out, total_steps=3, group_size=3, prompts_per_step=2)
    assert (counts.lost, counts.duplicated, counts.trained, counts.problems) == (0, 0, 18, [])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_actor_killed_after_its_last_result_comes_back_once_for_the_final_validation(tmp_path):
    """As above with validation every 2 steps, so a final round follows the last step: the rollout worker whose
    weight-sync connection broke waits for the actor's store before it generates the round. Before, the actor
    was not restarted and the round stalled: rollout-0 killed for "no progress for 62 s" and, `maxRestarts: 0`,
    exit 137 "the job did not finish". Now the actor is restarted alone, once, not counted: exit 0, rounds at 0,
    2 and 3 once each, both checkpoints exported once, 18 trained, nothing lost or duplicated."""
    out = _run_killed(tmp_path, ("actor", "omnirl.actor.service:ActorService._publish_done", "after",
                                 "args[1].step == 2"), val_every=2, max_restarts=0)
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert [(e["role"], e["action"]) for e in events] == [(
        "actor-0", "restarted alone, not counted against maxRestarts (the job's last step, 2, was trained and "
        "reported: nothing is left for the actor, but the final validation round's rollout workers wait for its "
        "weight-sync store)")], events
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records].count("start") == 1 and [r["event"] for r in records].count("finish") == 1
    assert [r["step"] for r in records if r["event"] == "step"] == [0, 1, 2]
    assert [r["step"] for r in records if r["event"] == "validation"] == [0, 2, 3]
    assert sorted(p.name for p in (out / "exports").iterdir()) == ["latest", "step-000001", "step-000002"]
    counts = check_ledger(out, total_steps=3, group_size=3, prompts_per_step=2)
    assert (counts.lost, counts.duplicated, counts.trained, counts.problems) == (0, 0, 18, [])
