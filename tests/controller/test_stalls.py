"""Waits that said nothing: the controller waiting for scores that do not come while every role beats
(`controller/stall.py::ScoreWait`), and `omnirl run`'s supervisor on a manifest's Redis that went away
(`launch/supervise.py`: it blocked ~4 min inside a heartbeat read, then died on a traceback)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml
from tests.helpers import jpeg_reward_job

import omnirl.launch.supervise as supervise
from omnirl.api.loader import dump_rljob, job_from_dict
from omnirl.controller.stall import ScoreWait
from omnirl.transfer import TransferQueue
from omnirl.transfer.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_a_wait_without_a_new_score_names_the_step_the_count_and_who_holds_the_samples(redis_url, tmp_path, caplog):
    job, _ = jpeg_reward_job(f"stall-{uuid.uuid4().hex[:8]}", redis_url, tmp_path)
    doc = dump_rljob(job)
    doc["spec"]["failurePolicy"] = {"progressDeadlineSeconds": 60}
    doc["spec"]["reward"].append({"name": "judge", "kind": "http", "url": "http://127.0.0.1:9/v1/score",
                                  "timeoutSeconds": 3600, "weight": 0.5})
    spec = job_from_dict(doc).spec
    queue = TransferQueue.for_job(job.metadata.name, spec.transferQueue, redis_url)
    try:
        s = queue.streams
        for stream, group in ((s.samples, "reward"), (s.requests, "rollout")):
            queue.ensure_group(stream, group)
        for i in range(5):
            queue.publish(s.samples, {"sample_id": f"3:0:{i}"})
        queue.consume(s.samples, "reward", "reward-0", count=3, block_ms=0)  # 3 held by reward-0, 2 not delivered
        wait = ScoreWait(queue, spec)
        wait.begin("step 3", now=1000.0)
        with caplog.at_level(logging.WARNING, logger="omnirl.controller"):
            assert wait.check(2, 12, now=1059.0) is None  # within progressDeadlineSeconds
            line = wait.check(2, 12, now=1061.0)
            assert wait.check(2, 12, now=1100.0) is None  # not again before another 60 s
            again = wait.check(4, 12, now=1122.0)
            wait.arrived(now=1130.0)  # a score: the silence counts from it
            assert wait.check(5, 12, now=1180.0) is None
        assert line == (
            "step 3: no new score for 61 s (failurePolicy.progressDeadlineSeconds 60), 2 of 12 scores in; samples to "
            "score: reward-0 holds 3, 2 not delivered yet; requests to generate: none pending. A role that beats is "
            "working or waiting: look at reward-0's log (omnirl run: OUT/logs/reward-0.log); a remote scorer that "
            "accepts a call and does not answer holds it up to spec.reward[].timeoutSeconds (judge 3600 s) per try: "
            "lower it to fail such calls sooner. The run goes on waiting")
        assert again.startswith("step 3: no new score for 122 s (") and ", 4 of 12 scores in;" in again
        assert [r.getMessage() for r in caplog.records] == [line, again] and wait.said == 2
    finally:
        queue.cleanup()
        queue.close()


def test_a_wait_while_the_rollout_still_compiles_says_so(redis_url, tmp_path):
    """On a GPU the first step's torch.compile can outlast progressDeadlineSeconds: the line names the workers
    whose last beat a start-up or a compilation wrote, and the bound, instead of reading as a hang."""
    from omnirl.transfer.heartbeat import Heartbeat

    job, _ = jpeg_reward_job(f"stall-{uuid.uuid4().hex[:8]}", redis_url, tmp_path)
    doc = dump_rljob(job)
    doc["spec"]["failurePolicy"] = {"progressDeadlineSeconds": 60, "startupDeadlineSeconds": 900}
    spec = job_from_dict(doc).spec
    queue = TransferQueue.for_job(job.metadata.name, spec.transferQueue, redis_url)
    try:
        s = queue.streams
        queue.ensure_group(s.requests, "rollout")
        queue.publish(s.requests, {"request_id": "0:0"})
        queue.consume(s.requests, "rollout", "rollout-0", count=1, block_ms=0)
        Heartbeat(queue.redis, job.metadata.name, "rollout", "rollout-0").beat(startup=True)
        Heartbeat(queue.redis, job.metadata.name, "reward", "reward-0").beat()
        Heartbeat(queue.redis, job.metadata.name, "actor", "actor-0").beat(startup=True)  # not the wait's
        wait = ScoreWait(queue, spec)
        wait.begin("step 0", now=0.0)
        line = wait.check(0, 8, now=61.0)
        assert ("requests to generate: rollout-0 holds 1. rollout-0 is still loading or compiling (the last beat says "
                "so), which may take up to failurePolicy.startupDeadlineSeconds (900 s) per start-up or compilation; "
                "A role that beats is working or waiting: look at rollout-0's log") in line
        Heartbeat(queue.redis, job.metadata.name, "rollout", "rollout-0").beat()  # compiled: its loop beats
        assert "loading or compiling" not in wait.check(0, 8, now=122.0)
    finally:
        queue.cleanup()
        queue.close()


# ------------------------------------------------------------------ a manifest's Redis that goes away

# a role that beats every 0.2 s `beats` times, riding out a Redis away (as the roles' retrying clients do), then
# exits 0
BEATER = """
import sys, time, redis
from omnirl.transfer.heartbeat import Heartbeat
url, job, worker, beats = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
beat = Heartbeat(redis.Redis.from_url(url, socket_connect_timeout=0.5), job, worker.split('-')[0], worker, every_s=0.2)
print('started', flush=True)
for _ in range(beats):
    try:
        beat.beat()
    except redis.RedisError:
        pass
    time.sleep(0.2)
"""


def _redis(port: int, workdir: Path) -> subprocess.Popen:
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(workdir)], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    import redis as redis_py

    while True:
        try:
            redis_py.Redis(port=port, socket_connect_timeout=0.2).ping()
            return proc
        except redis_py.RedisError:
            assert time.monotonic() < deadline and proc.poll() is None, "redis-server did not start"
            time.sleep(0.05)


def _supervise(tmp_path: Path, url: str, beats: int):
    """A Supervisor (in this process) of two beating scripts on the manifest's Redis `url`: the controller's
    exits 0 after `beats` beats, the job's end; returns (supervisor, thread, result dict): the thread runs `run()`."""
    from omnirl.launch.procs import RoleProcess, _Child

    doc = yaml.safe_load((ROOT / "examples" / "ocr-flowgrpo.yaml").read_text())
    name = f"away-{uuid.uuid4().hex[:8]}"
    doc["metadata"]["name"] = name
    doc["spec"]["transferQueue"] = {"redisUrl": url}
    doc["spec"]["failurePolicy"] = {"progressDeadlineSeconds": 3}  # an outage longer than it kills no role
    job = job_from_dict(doc)
    (tmp_path / "logs").mkdir(exist_ok=True)

    def start(role: str, index: int, resume: str) -> RoleProcess:
        return RoleProcess(role, index, _Child([sys.executable, "-c", BEATER, url, name, f"{role}-{index}",
                                                str(beats if role == "controller" else 10 * beats)],
                                               {"PYTHONPATH": os.environ.get("PYTHONPATH", "")},
                                               str(tmp_path / "logs" / f"{role}-{index}.log")))

    queue = TransferQueue.for_job(name, job.spec.transferQueue, url)
    sup = supervise.Supervisor(job, [("rollout", 0), ("controller", 0)], start, queue, tmp_path, 1)
    result: dict = {}

    def run() -> None:
        try:
            result["code"] = sup.run()
        finally:
            sup.stop_all(grace_s=1.0)
            sup.close()
            queue.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return sup, thread, result


def test_a_manifests_redis_that_goes_away_and_comes_back_is_said_at_once_and_the_run_goes_on(tmp_path, capsys):
    port = free_port()
    server = _redis(port, tmp_path)
    try:
        sup, thread, result = _supervise(tmp_path, f"redis://127.0.0.1:{port}/0", beats=60)  # 12 s of beats
        time.sleep(2)
        server.terminate()
        server.wait(5)
        t_down, out = time.monotonic(), ""
        while "is unreachable" not in out:  # a few seconds; generous for a loaded box
            assert time.monotonic() - t_down < 30, out
            time.sleep(0.2)
            out += capsys.readouterr().out
        time.sleep(max(0.0, t_down + 5 - time.monotonic()))  # down longer than progressDeadlineSeconds (3)
        server = _redis(port, tmp_path)
        thread.join(60)
        assert not thread.is_alive()
    finally:
        server.terminate()
        server.wait(5)
    out += capsys.readouterr().out
    said = [line for line in out.splitlines() if "is unreachable" in line]
    assert result["code"] == 0, out  # the controller script finished: no restart, no failure
    assert re.fullmatch(
        rf"omnirl: Redis at 127\.0\.0\.1:{port}/0 \(spec\.transferQueue\.redisUrl\) is unreachable: no answer since "
        r"\d\d:\d\d:\d\d \(\d+ s; ConnectionError: .*\); the roles wait for it \(their calls retry for 120 s\) and so "
        r"does this run, until \d\d:\d\d:\d\d \(150 s\), then it stops \(exit 1; --resume continues once that Redis "
        r"is back with its data\)", said[0]), said[0]
    assert len(said) == 1  # repeated every 30 s only
    back = [line for line in out.splitlines() if "answers again" in line]
    assert len(back) == 1 and re.fullmatch(rf"omnirl: redis: 127\.0\.0\.1:{port}/0 answers again after \d+ s → the run "
                                           "goes on", back[0]), out
    assert "no progress" not in out and "restart" not in out, out


def test_a_manifests_redis_that_hangs_is_said_within_seconds_and_the_run_goes_on(tmp_path, capsys):
    """A Redis that accepts and does not answer (SIGSTOPped; a host cut off by the network): each try of the
    PING costs its whole socket timeout, and the probe's 7 retries (redis_client's default) made that 21 s
    before the first line; a 12 s hang of `omnirl run`'s Redis was not said at all. One retry: ~5 s."""
    import signal

    port = free_port()
    server = _redis(port, tmp_path)
    try:
        sup, thread, result = _supervise(tmp_path, f"redis://127.0.0.1:{port}/0", beats=40)  # 8 s of beats
        time.sleep(2)
        server.send_signal(signal.SIGSTOP)
        t_stop, out = time.monotonic(), ""
        while "is unreachable" not in out and time.monotonic() - t_stop < 30:
            time.sleep(0.2)
            out += capsys.readouterr().out
        said_after = time.monotonic() - t_stop
        server.send_signal(signal.SIGCONT)
        thread.join(60)
        assert not thread.is_alive()
    finally:
        server.send_signal(signal.SIGCONT)
        server.terminate()
        server.wait(5)
    out += capsys.readouterr().out
    assert said_after < 12, (said_after, out)  # 2 s between PINGs + 2 tries of 2 s, on a busy box
    said = [line for line in out.splitlines() if "is unreachable" in line]
    assert len(said) == 1 and re.search(r"is unreachable: no answer since \d\d:\d\d:\d\d \(\d+ s; TimeoutError: ",
                                        said[0]), out
    assert result["code"] == 0 and len([line for line in out.splitlines() if "answers again" in line]) == 1, out


def test_a_manifests_redis_that_stays_away_stops_the_run_after_the_bound(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(supervise, "REDIS_DOWN_S", 15.0)  # 150 s in a run
    monkeypatch.setattr(supervise, "REDIS_NOTE_S", 4.0)
    port = free_port()
    server = _redis(port, tmp_path)
    try:
        sup, thread, result = _supervise(tmp_path, f"redis://127.0.0.1:{port}/0", beats=1000)
        time.sleep(3)
        server.terminate()
        server.wait(5)
        t0 = time.monotonic()
        thread.join(60)
        took = time.monotonic() - t0
    finally:
        if server.poll() is None:
            server.terminate()
    out = capsys.readouterr().out
    assert result["code"] == 1, out
    assert 12 <= took < 45, took  # the bound (15 s) after its last answer; not the clients' 120 s retries
    said = [line for line in out.splitlines() if "is unreachable" in line]
    assert 2 <= len(said) <= 4, out  # the first within seconds, then every 4 s
    assert re.fullmatch(
        rf"{re.escape(f'127.0.0.1:{port}/0')} \(spec\.transferQueue\.redisUrl\) has not answered since "
        r"\d\d:\d\d:\d\d \(\d+ s, ConnectionError: .*\); the roles' calls give up after 120 s; start that Redis "
        r"again \(with its data: AOF or RDB\), then continue with --resume", sup.failure), sup.failure
    assert "restart" not in out, out


# ------------------------------------------------------------------ the controller's wait, through `omnirl run`

def _listens(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_omnirl_run_with_a_judge_that_never_answers_says_the_wait_with_its_holder(tmp_path):
    """The user's path: `omnirl run` of a tiny job whose http judge accepts every call and answers none within
    its `timeoutSeconds` (3600): the reward worker beats (waiting on a remote scorer), so nothing is stale and the
    run printed no line at all (2 min 20 s measured until stopped). Now the controller's line comes once
    `progressDeadlineSeconds` (10 here) passed with no score, naming the holder."""
    from e2e.chaos import chaos_job

    port = free_port()
    judge = subprocess.Popen([sys.executable, "-m", "omnirl.cli", "scorer", "serve", "--reward", "jpeg", "--protocol",
                              "http", "--host", "127.0.0.1", "--port", str(port), "--delay-ms", "10000000"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    path = chaos_job(tmp_path, f"deaf-{uuid.uuid4().hex[:6]}", 1)
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["reward"].append({"name": "judge", "kind": "http", "url": f"http://127.0.0.1:{port}/v1/score",
                                  "timeoutSeconds": 3600, "weight": 0.5})
    doc["spec"]["failurePolicy"]["progressDeadlineSeconds"] = 10
    path.write_text(yaml.safe_dump(doc))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "services"), str(ROOT / "operator"), str(ROOT)])}
    run, lines = None, []
    try:
        deadline = time.monotonic() + 60
        while not _listens(port):
            assert time.monotonic() < deadline and judge.poll() is None, "the judge did not start"
            time.sleep(0.2)
        run = subprocess.Popen([sys.executable, "-u", "-m", "omnirl.cli", "run", str(path), "--no-ray", "--device",
                                "cpu", "--out", str(tmp_path / "out")], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=env)
        threading.Thread(target=lambda: lines.extend(line.rstrip("\n") for line in run.stdout), daemon=True).start()
        deadline = time.monotonic() + 300  # start-up on a loaded box, then 10 s without a score
        while not any("no new score" in line for line in lines):
            assert time.monotonic() < deadline and run.poll() is None, "\n".join(lines[-30:])
            time.sleep(0.5)
    finally:
        if run is not None:
            run.terminate()  # the launcher's Ctrl-C path: stops every role
            run.wait(120)
        judge.terminate()
        judge.wait(10)
    said = [line for line in lines if "no new score" in line]
    assert re.search(
        r"WARNING omnirl\.controller: step 0: no new score for 1\d s \(failurePolicy\.progressDeadlineSeconds 10\), "
        r"[0-5] of 6 scores in; samples to score: reward-0 holds \d+(, \d+ not delivered yet)?; requests to generate: "
        r"[^.]*\. A role that beats is working or waiting: look at reward-0's log \(omnirl run: "
        r"OUT/logs/reward-0\.log\); a remote scorer that accepts a call and does not answer holds it up to "
        r"spec\.reward\[\]\.timeoutSeconds \(judge 3600 s\) per try: lower it to fail such calls sooner\. The run goes "
        r"on waiting$", said[0]), said[0]
