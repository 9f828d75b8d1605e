"""Faults on one machine, compared with a run without them: the job heals itself and ends where an
uninterrupted one ends (`sync` mode, CPU, the same seed): the same samples, rewards and groups at
every step, the same weights up to float32 rounding (see the test's comment for why not bitwise)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml
from e2e.chaos import chaos_job
from safetensors.torch import load_file

from omnirl.api.exits import INTERRUPTED_EXIT, TERMINATED_EXIT
from omnirl.evaluation.ledger import check_ledger, final_lineage

ROOT = Path(__file__).resolve().parents[1]
NOT_REPLAYED = {"time", "sync_bytes", "checkpoint"}
"""Besides the wall-clock fields (`*_seconds`, `*_per_second`): when and how the step ran, not what it computed."""


def timing(key: str) -> bool:
    """A field that differs between two runs of the same steps (wall clock, CPU waits, paths, bytes on the wire)."""
    return key in NOT_REPLAYED or key.endswith("_seconds") or key.endswith("_per_second")


def sync_job(tmp: Path, name: str) -> Path:
    path = chaos_job(tmp, name, steps=4)
    import yaml

    doc = yaml.safe_load(path.read_text())
    doc["spec"]["pipeline"] = {"mode": "sync"}
    path.write_text(yaml.safe_dump(doc))
    return path


def start(job: Path, out: Path, resume: bool = False) -> subprocess.Popen:
    """`omnirl run` in the background, its output appended to `{out}.log` (a pipe could fill and block it)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "services"), str(ROOT / "operator"), str(ROOT)])}
    with open(f"{out}.log", "a") as log:
        return subprocess.Popen([sys.executable, "-m", "omnirl.cli", "run", str(job), "--out", str(out), "--no-ray",
                                 *(["--resume"] if resume else [])],
                                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)


def tail(out: Path) -> str:
    return Path(f"{out}.log").read_text()[-3000:]


def steps(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["event"] == "step"]


def wait_for_step(proc: subprocess.Popen, out: Path, step: int, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(r["step"] == step for r in steps(out)):
        assert proc.poll() is None, tail(out)
        assert time.monotonic() < deadline, f"step {step} not reached"
        time.sleep(0.2)


def pid_of(out: Path, role: str) -> int:
    return json.loads((out / "roles.json").read_text())[role]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # real jobs under faults: minutes on 2 busy cores
def test_sigterm_of_the_controller_and_sigkill_of_the_actor_end_with_the_uninterrupted_weights(tmp_path):
    calm, hurt = tmp_path / "calm", tmp_path / "hurt"
    a = start(sync_job(tmp_path, "calm"), calm)
    assert a.wait(timeout=1200) == 0, tail(calm)
    b = start(sync_job(tmp_path, "hurt"), hurt)
    wait_for_step(b, hurt, 0)
    os.kill(pid_of(hurt, "controller-0"), signal.SIGTERM)  # a node drain: the job restarts from a checkpoint
    wait_for_step(b, hurt, 2)
    # step 3 held in flight: it cannot end without the rollout worker (its samples, then the broadcast of its
    # weights), so a frozen worker keeps the actor needed however fast the machine is (a second's sleep here let
    # the job finish first on an idle machine: the actor was then not restarted, issue 36)
    rollout = pid_of(hurt, "rollout-0")
    os.kill(rollout, signal.SIGSTOP)
    try:
        assert [r["step"] for r in steps(hurt)] == [0, 1, 2], tail(hurt)
        os.kill(pid_of(hurt, "actor-0"), signal.SIGKILL)
    finally:
        os.kill(rollout, signal.SIGCONT)
    assert b.wait(timeout=1200) == 0, tail(hurt)

    events = [json.loads(line) for line in (hurt / "events.jsonl").read_text().splitlines()]
    assert [(e["role"], e["action"]) for e in events] == [("controller-0", "restart-job"), ("actor-0", "restart-job")]
    assert events[0]["reason"].startswith(f"exit {TERMINATED_EXIT}")  # SIGTERM: handed back, not crashed
    ckpts = [json.loads(line)["checkpoint"] for line in (hurt / "ledger" / "checkpoints-actor-0.jsonl")
             .read_text().splitlines()]
    assert 0 in ckpts  # the SIGTERM checkpoint of step 0 (scheduled ones are steps 1 and 3)
    counts = check_ledger(hurt, total_steps=4, group_size=3, prompts_per_step=2)
    assert (counts.lost, counts.duplicated, counts.trained, counts.problems) == (0, 0, 24, [])

    # the same samples, rewards and groups, step by step, and the same final weights as the run
    # without faults — up to float32 rounding: after a restart the rollout engine batches the
    # recovered requests differently, and a CPU matmul rounds differently at another batch size
    # (seen: bitwise equal, or weights within 6e-8 of |w| <= 0.36, loss/kl in the 8th digit)
    calm_steps, hurt_steps = steps(calm), steps(hurt)
    assert [r["step"] for r in hurt_steps] == [r["step"] for r in calm_steps] == [0, 1, 2, 3]
    for a_rec, b_rec in zip(calm_steps, hurt_steps, strict=True):
        keys = {k for k in set(a_rec) | set(b_rec) if not timing(k)}
        exact = {k for k in keys if not isinstance(a_rec.get(k), float) or k.startswith("reward")}
        assert {k: a_rec.get(k) for k in exact} == {k: b_rec.get(k) for k in exact}
        for k in keys - exact:
            assert b_rec[k] == pytest.approx(a_rec[k], rel=1e-4, abs=5e-7), (a_rec["step"], k)  # 5e-7: a few float32 ulps of 1
    assert Counter(r["sample_id"] for r in _actor_rows(calm)) == Counter(
        r["sample_id"] for r in final_lineage(hurt, 4))
    wa = load_file(calm / "checkpoints" / "latest" / "policy.safetensors")
    wb = load_file(hurt / "checkpoints" / "latest" / "policy.safetensors")
    assert wa.keys() == wb.keys() and all(torch.allclose(wa[k], wb[k], rtol=0, atol=1e-6) for k in wa)


def _actor_rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "ledger" / "actor-actor-0.jsonl").read_text().splitlines()]


def freeze_rollout_once_step_is_handed_over(proc: subprocess.Popen, out: Path, job_name: str, step: int) -> int:
    """SIGSTOP the rollout worker once `step`'s 6 samples are generated and the batch is handed to
    the actor (`kv:trainreqs`), then give the actor a second to train it: the actor is then waiting
    in the weight sync for a worker that cannot answer. Returns the worker's PID."""
    import re

    import redis as redis_py

    rollout_ledger = out / "ledger" / "rollout-rollout-0.jsonl"
    deadline = time.monotonic() + 600
    while sum(line.count(f'"sample_id": "{step}:') for line in rollout_ledger.read_text().splitlines()) < 6:
        assert time.monotonic() < deadline and proc.poll() is None, tail(out)
        time.sleep(0.05)
    pid = pid_of(out, "rollout-0")
    os.kill(pid, signal.SIGSTOP)
    url = re.search(r"\(redis (redis://\S+),", Path(f"{out}.log").read_text()).group(1)
    r = redis_py.Redis.from_url(url)
    while not r.hexists(f"omnirl:{job_name}:kv:trainreqs", str(step)):  # scored and handed to the actor
        assert time.monotonic() < deadline, tail(out)
        time.sleep(0.05)
    r.close()
    time.sleep(1.0)
    return pid


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_an_actor_restarted_alone_replays_its_step_and_the_waiting_controller_goes_on(tmp_path):
    """failurePolicy.actor: restart-role — the controller lives on, waiting for step 2, which the
    killed actor had trained but not announced; the new actor resumes from checkpoint 1, replays
    the stored batch of step 2 and publishes its result again (before, the controller waited for
    it forever)."""
    import yaml

    job = sync_job(tmp_path, "alone")
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["failurePolicy"]["actor"] = "restart-role"
    job.write_text(yaml.safe_dump(doc))
    out = tmp_path / "alone"
    proc = start(job, out)
    wait_for_step(proc, out, 1)  # checkpoint 1 is written
    rollout = freeze_rollout_once_step_is_handed_over(proc, out, "alone", 2)
    os.kill(pid_of(out, "actor-0"), signal.SIGKILL)
    os.kill(rollout, signal.SIGCONT)
    assert proc.wait(timeout=900) == 0, tail(out)

    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert [(e["role"], e["action"]) for e in events] == [("actor-0", "restart-role")]
    assert [r["step"] for r in steps(out)] == [0, 1, 2, 3]  # one line per step, none written twice
    counts = check_ledger(out, total_steps=4, group_size=3, prompts_per_step=2)
    assert (counts.lost, counts.duplicated, counts.trained, counts.problems) == (0, 0, 24, [])


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_stop_while_the_actor_waits_for_a_stopping_rollout_worker_still_checkpoints_the_step(tmp_path):
    """SIGTERM of `omnirl run` (Ctrl-C, a node drain) while the actor broadcasts to a rollout worker
    that cannot answer: the actor stops waiting, checkpoints the step it trained, and `--resume`
    ends the job with every sample trained once. Before, it waited out the sync timeout, was
    SIGKILLed after the grace period and its SIGTERM checkpoint was never written."""
    job, out = sync_job(tmp_path, "halt"), tmp_path / "halt"
    proc = start(job, out)
    wait_for_step(proc, out, 1)  # checkpoints are scheduled at steps 1 and 3: step 2 has none of its own
    freeze_rollout_once_step_is_handed_over(proc, out, "halt", 2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=600) == INTERRUPTED_EXIT, tail(out)
    ckpts = [json.loads(line)["checkpoint"] for line in (out / "ledger" / "checkpoints-actor-0.jsonl")
             .read_text().splitlines()]
    assert ckpts == [1, 2], tail(out)  # the SIGTERM checkpoint of step 2

    again = start(job, out, resume=True)
    assert again.wait(timeout=900) == 0, tail(out)
    assert [r["step"] for r in steps(out)] == [0, 1, 2, 3]  # step 2's line written by the successor
    counts = check_ledger(out, total_steps=4, group_size=3, prompts_per_step=2)
    assert (counts.lost, counts.duplicated, counts.trained, counts.problems) == (0, 0, 24, [])


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (a dead role reparented to an init that has not reaped it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signals are Linux's")
def test_a_sigkilled_launcher_takes_its_roles_with_it_and_resume_finishes_the_job(tmp_path):
    """SIGKILL of `omnirl run --no-ray` itself (an OOM kill, a closed terminal's kill -9): its Redis and
    every role process go with it (before, the roles were left behind, stuck in Redis retries), and
    `--resume` finishes the job with every sample trained once. (In CI it once hung: the rollout had
    been killed between publishing a sample and counting it, so the sync-mode reward role waited for
    a count it never saw; the count is now part of the atomic publish.)"""
    job, out = sync_job(tmp_path, "orphan"), tmp_path / "orphan"
    proc = start(job, out)
    wait_for_step(proc, out, 1)
    pids = json.loads((out / "roles.json").read_text())
    proc.kill()
    proc.wait(timeout=60)
    deadline = time.monotonic() + 120
    while any(_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert {name: pid for name, pid in pids.items() if _alive(pid)} == {}, tail(out)

    again = start(job, out, resume=True)
    assert again.wait(timeout=600) == 0, tail(out)
    assert [r["step"] for r in steps(out)] == [0, 1, 2, 3]
    counts = check_ledger(out, total_steps=4, group_size=3, prompts_per_step=2)
    assert (counts.lost, counts.duplicated, counts.trained, counts.problems) == (0, 0, 24, [])


@pytest.mark.slow
def test_resume_of_a_run_stopped_before_its_first_checkpoint_needs_no_restart(tmp_path):
    """`omnirl run --resume` of a run whose launcher died before the first checkpoint: the roles
    start as after a restart (`OMNIRL_RESUME=auto`) and finish the job with every sample trained
    once. With `OMNIRL_RESUME=1` the actor failed with a FileNotFoundError traceback ("no
    checkpoint") and the job was restarted once (restart-job 1/N in events.jsonl) before it went on."""
    job, out = sync_job(tmp_path, "early"), tmp_path / "early"
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["checkpoint"] = {"everySteps": 4, "keep": 1}  # the first checkpoint is at the last step
    job.write_text(yaml.safe_dump(doc))
    proc = start(job, out)
    wait_for_step(proc, out, 0)
    proc.kill()
    proc.wait(timeout=60)
    assert not (out / "checkpoints" / "latest").exists()
    again = start(job, out, resume=True)
    assert again.wait(timeout=600) == 0, tail(out)
    assert (out / "events.jsonl").read_text() == "", tail(out)  # nothing failed, nothing restarted
    assert [r["step"] for r in steps(out)] == [0, 1, 2, 3]
    counts = check_ledger(out, total_steps=4, group_size=3, prompts_per_step=2)
    assert (counts.lost, counts.duplicated, counts.trained, counts.problems) == (0, 0, 24, [])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_resume_of_a_run_stopped_after_its_last_step_writes_the_export_it_missed(tmp_path):
    """A stop (Ctrl-C) after the last step was trained but before the controller exported it and
    wrote its final record: `--resume` said "has trained 2 steps, the job asks for 2: nothing to do"
    although the interrupt verdict had told the user to resume, and the run never got
    `exports/latest`. Now the roles start, the controller (with nothing left to train) exports the
    actor's latest checkpoint and finishes. The stop is reproduced exactly where it matters: a
    finished run loses its `finish` record and its exports."""
    job, out = chaos_job(tmp_path, "late", steps=1), tmp_path / "late"
    first = start(job, out)
    assert first.wait(timeout=600) == 0, tail(out)
    assert json.loads((out / "exports" / "latest" / "export.json").read_text())["step"] == 0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["event"] == "finish"
    (out / "metrics.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    __import__("shutil").rmtree(out / "exports")

    again = start(job, out, resume=True)
    assert again.wait(timeout=600) == 0, tail(out)
    assert "nothing to do" not in tail(out)
    assert json.loads((out / "exports" / "latest" / "export.json").read_text())["step"] == 0
    assert [r["step"] for r in steps(out)] == [0]  # nothing trained twice
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["event"] == "finish"
    # a finished run has nothing to do: the roles are not started again
    done = start(job, out, resume=True)
    assert done.wait(timeout=120) == 0 and "nothing to do" in tail(out)
