"""A role's start-up and torch.compile count as progress, for at most `startupDeadlineSeconds`.

A role loading its model (a big checkpoint from slow storage) or compiling (model.compile's first
step) keeps no heartbeat from its main loop; with `progressDeadlineSeconds` shorter than that, the
supervisor killed healthy roles over and over (`omnirl run` of the OCR example with compile on and a
15 s deadline failed after 3 restarts of the actor; a 25 s load failed the same way). A role's
start-up (`omnirl role` from before it imports torch until its service is built) and each compilation
now beat from a thread, bounded by `failurePolicy.startupDeadlineSeconds`, so a load stuck for good is
still killed `progressDeadlineSeconds` after that bound.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
import torch
import yaml

from omnirl.api.exits import TERMINATED_EXIT
from omnirl.api.loader import job_from_dict
from omnirl.models.compile import while_compiling
from omnirl.transfer.heartbeat import Heartbeat, read_heartbeats

ROOT = Path(__file__).resolve().parents[2]
# imported by every Python process started with this directory first on PYTHONPATH: a role process
# (`omnirl role ...`) sleeps SLOW_LOAD_S seconds more while it builds its service (model load), as on
# slow storage
SLOW_LOAD = """
import os, sys, time
if os.environ.get("SLOW_LOAD_S") and "role" in sys.argv:
    import omnirl.launch.roles as roles  # no torch: importing omnirl.models here would move its import first
    build = roles._build
    def slow_build(*args, **kwargs):
        time.sleep(float(os.environ["SLOW_LOAD_S"]))
        return build(*args, **kwargs)
    roles._build = slow_build
"""


def _run(tmp_path: Path, load_s: float, **policy) -> tuple[subprocess.CompletedProcess, float]:
    """`omnirl run` of examples/ocr-nft.yaml (2 prompts × 4 samples: a short step) for 1 step without
    validation, every role's start-up taking `load_s` seconds longer, `failurePolicy` = `policy`.
    Returns the process and its seconds."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW_LOAD)
    doc = yaml.safe_load((ROOT / "examples" / "ocr-nft.yaml").read_text())
    doc["spec"]["data"] = {"trainPrompts": str(ROOT / "examples" / "prompts" / "ocr-train.txt")}
    doc["spec"]["algorithm"].update(promptsPerStep=2, groupSize=4)
    doc["spec"]["failurePolicy"] = policy
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    env = {**os.environ, "SLOW_LOAD_S": str(load_s),
           "PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")])}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", str(tmp_path / "job.yaml"), "--no-ray",
                           "--device", "cpu", "--steps", "1", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=600, env=env)
    return proc, time.monotonic() - t0


@pytest.mark.slow
def test_a_model_load_longer_than_the_progress_deadline_is_not_a_hang(tmp_path):
    """Every role's start-up takes 20 s more, the deadline is 10 s: the job finishes, no role restarted
    (before: `rollout-0: no progress for 10 s` → restart, until maxRestarts failed the job; with the
    services beating only around their own loads, four roles importing torch on 2 cores still took
    more than 10 s before the first beat)."""
    proc, _ = _run(tmp_path, 20, progressDeadlineSeconds=10, maxRestarts=1)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    events = (tmp_path / "out" / "events.jsonl").read_text()
    assert events == "", events
    assert "no progress" not in proc.stdout
    lines = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if line.get("event") == "step"] == [0]  # the one step, trained


@pytest.mark.slow
def test_a_load_stuck_past_the_startup_deadline_is_still_killed(tmp_path):
    """A load that would take 300 s with startupDeadlineSeconds 5 and progressDeadlineSeconds 10: its
    beats stop after 5 s, the supervisor kills it 10 s later (exit 137, maxRestarts 0), long before the
    load would have ended."""
    proc, seconds = _run(tmp_path, 300, progressDeadlineSeconds=10, startupDeadlineSeconds=5, maxRestarts=0)
    assert proc.returncode == 137, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "failed (no progress for " in proc.stdout.splitlines()[-1]
    # the knob to raise is the start-up's (the line named only progressDeadlineSeconds)
    assert "ran past failurePolicy.startupDeadlineSeconds=5 (raise it if" in proc.stdout.splitlines()[-1]
    assert seconds < 120, seconds  # imports and Redis take seconds on a busy 2-core box; the load 300


def test_a_compilation_beats_for_at_most_the_bound(redis_url):
    """`while_compiling` + `Heartbeat.start_covering`: a torch.compile compilation (seconds on a CPU)
    writes beats while it runs, where the caller's loop writes none; the thread stops with it."""
    client = redis.Redis.from_url(redis_url)
    beat = Heartbeat(client, "compiling", "actor", "actor-0", every_s=0.1)
    torch._dynamo.reset()  # a fresh cache: the call below compiles (reset drops callbacks: before registering)
    unregister = while_compiling(lambda: beat.start_covering(60))
    seen: list[float] = []
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            doc = read_heartbeats(client, "compiling").get("actor-0")
            if doc is not None and doc["t"] not in seen:
                seen.append(doc["t"])

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        fn = torch.compile(lambda x: torch.nn.functional.gelu(x @ x.T).sum(-1), dynamic=True)
        # Inductor's on-disk caches (a warm machine: an earlier run of this test) made it 0.17 s in CI
        with torch._inductor.config.patch(force_disable_caches=True):
            t0 = time.time()
            fn(torch.randn(5, 7))
            t1 = time.time()
    finally:
        done.set()
        watcher.join()
        unregister()
    during = [t for t in seen if t0 <= t <= t1]
    assert t1 - t0 > 0.3, "compiled too fast to observe"
    assert len(during) >= 2, (t1 - t0, seen)  # no beat at all without the callbacks
    assert not [t for t in threading.enumerate() if t.name == "heartbeat-actor-0"]
    fn(torch.randn(6, 7))  # a cached graph (dynamic sizes): no compilation, no thread
    assert not [t for t in threading.enumerate() if t.name == "heartbeat-actor-0"]


def test_the_startup_probe_allows_the_startup_limit():
    """The kubelet's startup probe (every 10 s) allows startupDeadlineSeconds + progressDeadlineSeconds,
    what `omnirl run`'s supervisor allows: 1200 + 600 s by default, 7200 + 600 s for a slow store."""
    from omnirl_operator.pods import role_container
    from omnirl_operator.settings import OperatorSettings

    settings = OperatorSettings(default_redis_url="redis://redis:6379/0")
    doc = yaml.safe_load((ROOT / "examples" / "ocr-nft.yaml").read_text())
    probe = role_container(job_from_dict(doc), "rollout", settings)["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] == 1800
    doc["spec"]["failurePolicy"] = {"startupDeadlineSeconds": 7200}
    for role in ("rollout", "actor", "reward", "controller"):
        probe = role_container(job_from_dict(doc), role, settings)["startupProbe"]
        assert (probe["periodSeconds"], probe["failureThreshold"]) == (10, 780), role


def test_a_worker_deployment_waits_for_the_startup_probe_before_its_progress_deadline():
    """A rollout/reward Deployment with no Ready pod for its progressDeadlineSeconds reports
    ProgressDeadlineExceeded, which the operator takes for a failed role and restarts. It was a fixed
    900 s: a rollout worker loading for 1000 s, within the default startup probe's 1800 s
    (startupDeadlineSeconds 1200 + progressDeadlineSeconds 600), was restarted, and every load the
    README's `startupDeadlineSeconds: 7200` allows past 900 s too. Now the Deployment allows the
    startup probe's budget plus 900 s to schedule the pod and pull its image."""
    from omnirl_operator.builders import build_deployment
    from omnirl_operator.settings import OperatorSettings

    settings = OperatorSettings(default_redis_url="redis://redis:6379/0")
    doc = yaml.safe_load((ROOT / "examples" / "ocr-nft.yaml").read_text())
    for policy, budget in (({}, 1800), ({"startupDeadlineSeconds": 7200}, 7800)):
        doc["spec"]["failurePolicy"] = policy
        for role in ("rollout", "reward"):
            deployment = build_deployment(job_from_dict(doc), role, settings, "digest")
            probe = deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
            assert probe["periodSeconds"] * probe["failureThreshold"] == budget
            assert deployment["spec"]["progressDeadlineSeconds"] == 900 + budget, (role, policy)



def test_a_rollout_whose_actor_store_is_dead_says_so_and_stops_on_sigterm(tmp_path, redis_url, monkeypatch):
    """`omnirl role rollout` with OMNIRL_WEIGHT_SYNC_ADDR on a port nothing listens on (an actor that died
    before it listened): it said nothing for its whole bound (1800 s by default; a 70 s bound took 123 s)
    and ignored SIGTERM inside the store's connect (`timeout 120` left it running 27 min later). Now it
    warns with the address, the time waited, the deadline, the knob and the actor's heartbeat, and a
    SIGTERM ends it within seconds (exit 143)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    doc = yaml.safe_load((ROOT / "examples/ocr-nft.yaml").read_text())
    doc["spec"]["data"] = {"trainPrompts": str(ROOT / "examples/prompts/ocr-train.txt")}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    # REPORT_EVERY_S = 2 s in the role process
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(
        "import omnirl.weight_sync.receiver as r\nr.REPORT_EVERY_S = 2.0\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMNIRL_JOB_NAME": "dead-store", "OMNIRL_REDIS_URL": redis_url, "OMNIRL_OUT": str(tmp_path / "out"),
           "OMNIRL_WEIGHT_SYNC_ADDR": f"127.0.0.1:{port}", "OMNIRL_WORKER_ID": "rollout-0", "OMNIRL_DEVICE": "cpu",
           "PYTHONUNBUFFERED": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}
    proc = subprocess.Popen([sys.executable, "-m", "omnirl.cli", "role", "rollout", "--job", str(tmp_path / "job.yaml")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if sum("waiting for the actor's weight-sync store" in x for x in lines) == 2:
                break
        proc.send_signal(15)
        sent = time.monotonic()
        try:
            code = proc.wait(timeout=15)  # its few lines fit the pipe: read them after it exits
        except subprocess.TimeoutExpired:
            code = None
        stopped_s = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    lines += proc.stdout.readlines()
    waits = [x for x in lines if "waiting for the actor's weight-sync store" in x]
    assert f"at 127.0.0.1:{port} ([Errno 111] Connection refused): 2 s so far, trying until " in waits[0], lines
    assert waits[0].rstrip().endswith(" (1800 s, failurePolicy.startupDeadlineSeconds + progressDeadlineSeconds); "
                                      "no actor heartbeat in Redis (not started yet, or gone)"), waits[0]
    assert code == TERMINATED_EXIT and stopped_s < 5, (code, stopped_s, lines[-3:])
    assert lines[-1].strip() == "omnirl role rollout: stopped by SIGTERM, work handed back", lines[-3:]
