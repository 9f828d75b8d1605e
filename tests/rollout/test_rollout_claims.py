"""Two real rollout replicas (`omnirl role rollout` processes) on a real redis-server, weights served
by a `WeightSender` in this process, while one engine step of rollout-0 outlasts `claimIdleSeconds`
(as model.compile's first step does): rollout-0 keeps its claim on the requests it holds, so rollout-1
(idle, consuming every 200 ms) does not reclaim them and every sample is generated once; a replica
SIGKILLed in such a step loses its claim and the other takes its requests over.

Before the fix the claim was renewed only between engine steps: rollout-1 reclaimed rollout-0's requests
claimIdleSeconds into the step and generated them too (measured on `omnirl run` of the OCR example,
2 replicas, claimIdleSeconds 2, model.compile with Inductor's caches off: a 28 s first step, 116
generations of 80 samples, 36 of them twice; with the fix, first steps of 31 and 33 s: 80 generations).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from tests.helpers import wait_until

from omnirl.api.messages import GenerateRequest, SampleSeed
from omnirl.models.registry import load_adapter
from omnirl.transfer import TransferQueue
from omnirl.weight_sync import WeightSender, named_trainable_tensors

ROOT = Path(__file__).resolve().parents[2]
JOB, G = "rollclaims", 2
CLAIM_IDLE_S = 2  # renewed every 0.67 s: a 1.3 s stall of the shared CI box would be needed to lose it
# imported first by the role processes: every engine step's finished sample ids go to gen-{worker}.jsonl
# (a duplicate publish leaves no other trace), and a step waits while the file `gate-{worker}` exists
# (a step as long as the test needs: a compile, a loaded machine)
HOOK = """
import json, os, sys, time
if "role" in sys.argv and "rollout" in sys.argv:
    from omnirl.rollout.engine import RolloutEngine
    step, out, worker = RolloutEngine.step, os.environ["OMNIRL_OUT"], os.environ["OMNIRL_WORKER_ID"]
    def gated_step(self):
        while os.path.exists(os.path.join(out, "gate-" + worker)):
            time.sleep(0.05)
        results = step(self)
        with open(os.path.join(out, "gen-" + worker + ".jsonl"), "a") as f:
            f.write(json.dumps([r.request.sample_id for r in results]) + "\\n")
        return results
    RolloutEngine.step = gated_step
"""


def _manifest(tmp_path: Path, **policy) -> Path:
    doc = yaml.safe_load((ROOT / "examples" / "ocr-flowgrpo.yaml").read_text())
    doc["metadata"]["name"] = JOB
    for key in ("trainPrompts", "validationPrompts"):
        doc["spec"]["data"][key] = str(ROOT / "examples" / doc["spec"]["data"][key])
    doc["spec"]["transferQueue"] = {"claimIdleSeconds": CLAIM_IDLE_S}
    doc["spec"]["failurePolicy"] = policy
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _rollout(worker: str, manifest: Path, redis_url: str, port: int, out: Path) -> subprocess.Popen:
    env = {**os.environ, "OMNIRL_JOB_NAME": JOB, "OMNIRL_REDIS_URL": redis_url, "OMNIRL_WORKER_ID": worker,
           "OMNIRL_OUT": str(out), "OMNIRL_THREADS": "1", "OMNIRL_WEIGHT_SYNC_ADDR": f"127.0.0.1:{port}",
           "PYTHONPATH": os.pathsep.join([str(out / "hook"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "omnirl.cli", "role", "rollout", "--job", str(manifest)], env=env,
                            stdout=subprocess.DEVNULL, stderr=(out / f"{worker}.log").open("w"))


def _request(q: TransferQueue, index: int) -> None:
    key = f"0:{index}"
    req = GenerateRequest(kind="train", step=0, group_id=key, prompt=f'"{index % 10}"', prompt_ids=[1 + index % 10],
                          num_steps=3, window=[0], noise_level=0.8, sde_type="cps",
                          samples=[SampleSeed(sample_id=f"{key}:{i}", seed=i) for i in range(G)])
    q.publish(q.streams.requests, req.model_dump())


def _pending(q: TransferQueue) -> dict[str, tuple[str, int]]:
    """entry id → (owner, times delivered) of the rollout group's pending requests."""
    return {e["message_id"].decode(): (e["consumer"].decode(), e["times_delivered"])
            for e in q.redis.xpending_range(q.streams.requests, "rollout", "-", "+", 100)}


def _generated(out: Path) -> dict[str, Counter]:
    """worker → sample id → times its engine generated it."""
    return {p.stem[4:]: Counter(i for line in p.read_text().splitlines() for i in json.loads(line))
            for p in out.glob("gen-*.jsonl")}


@pytest.fixture()
def sender() -> Iterator[WeightSender]:
    """The actor's side: a `WeightSender` on a free port serving the built-in model as version 0 to every
    worker that registers (late and restarted ones too), from a thread."""
    tensors = named_trainable_tensors(load_adapter("ocr-digits", "builtin", device="cpu", dtype="float32").module,
                                      adapters_only=False)
    sender = WeightSender("127.0.0.1", 0, timeout_s=60)
    stop = threading.Event()

    def serve() -> None:
        while not stop.wait(0.1):
            sender.serve_new_members(tensors, 0)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        yield sender
    finally:
        stop.set()
        server.join()
        sender.close()


def _queue(tmp_path: Path, redis_client) -> TransferQueue:
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(HOOK)
    q = TransferQueue(redis_client, JOB, claim_idle_s=CLAIM_IDLE_S)
    q.ensure_group(q.streams.requests, "rollout")
    return q


def test_a_step_longer_than_the_claim_keeps_it_and_a_killed_replica_loses_it(tmp_path, redis_url, redis_client,
                                                                              sender):
    q, manifest = _queue(tmp_path, redis_client), _manifest(tmp_path)
    for i in range(8):  # rollout-0 reads 4 (one `consume`), then its first step waits at the gate
        _request(q, i)
    (tmp_path / "gate-rollout-0").touch()
    procs = {"rollout-0": _rollout("rollout-0", manifest, redis_url, sender.port, tmp_path)}
    try:
        held = wait_until(lambda: len(_pending(q)) == 4 and _pending(q), "rollout-0 to take 4 requests", 120)
        procs["rollout-1"] = _rollout("rollout-1", manifest, redis_url, sender.port, tmp_path)
        # rollout-1 reads the other 4 as new, generates them and goes on consuming every 200 ms
        wait_until(lambda: sum(_generated(tmp_path).get("rollout-1", Counter()).values()) >= 4 * G,
                   "rollout-1 to generate the 4 other requests", 120)
        seen = set()
        for _ in range(12):  # 3 claimIdleSeconds more of rollout-0's step
            time.sleep(CLAIM_IDLE_S / 4)
            seen |= set(_pending(q).values())
        # before the fix rollout-1 reclaimed rollout-0's 4 and generated them too
        assert _generated(tmp_path)["rollout-1"] == {f"0:{i}:{s}": 1 for i in range(4, 8) for s in range(G)}
        assert set(_pending(q)) == set(held) and seen == {("rollout-0", 1)}
        (tmp_path / "gate-rollout-0").unlink()
        wait_until(lambda: not _pending(q) and q.stream_length(q.streams.samples) == 8 * G, "the 8 requests' samples")
        gen = _generated(tmp_path)
        assert gen["rollout-0"] + gen["rollout-1"] == {f"0:{i}:{s}": 1 for i in range(8) for s in range(G)}
        assert set(gen["rollout-0"]) == {f"0:{i}:{s}" for i in range(4) for s in range(G)}

        # a replica killed in a long step releases its claim: the other reclaims claimIdleSeconds later
        procs["rollout-1"].send_signal(signal.SIGSTOP)  # so that rollout-0 reads the next 4
        time.sleep(0.5)  # a read rollout-1 had blocked in Redis (200 ms) returns empty meanwhile
        (tmp_path / "gate-rollout-0").touch()
        for i in range(8, 12):
            _request(q, i)
        # its blocked read returns with the first (1 to 4) of them, and its step waits at the gate
        held = wait_until(lambda: {o for o, _ in _pending(q).values()} == {"rollout-0"} and _pending(q),
                          "rollout-0 to take the next requests")
        procs["rollout-1"].send_signal(signal.SIGCONT)
        time.sleep(CLAIM_IDLE_S)
        assert set(_pending(q)) >= set(held) and {_pending(q)[i] for i in held} == {("rollout-0", 1)}
        procs["rollout-0"].send_signal(signal.SIGKILL)
        procs["rollout-0"].wait(30)
        wait_until(lambda: not _pending(q) and q.stream_length(q.streams.samples) == 12 * G,
                   "rollout-1 to take over and publish the next 4")
        gen = _generated(tmp_path)
        assert gen["rollout-0"] + gen["rollout-1"] == {f"0:{i}:{s}": 1 for i in range(12) for s in range(G)}
        assert set(gen["rollout-1"]) >= {f"0:{i}:{s}" for i in range(8, 12) for s in range(G)}  # rollout-0's too
        assert "generated twice" not in (tmp_path / "rollout-1.log").read_text()
        q.set_json("stop", True)
        assert procs["rollout-1"].wait(60) == 0
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    q.cleanup()


def _idle_ms(q: TransferQueue) -> int:
    """The longest time since a pending request of the rollout group was delivered or renewed, in ms."""
    return max(e["time_since_delivered"] for e in q.redis.xpending_range(q.streams.requests, "rollout", "-", "+", 10))


def test_a_stuck_replica_lets_its_claim_lapse(tmp_path, redis_url, redis_client, sender):
    """A step that does not end and does not beat (no compile covering it): its claim is renewed while the
    heartbeat is younger than `progressDeadlineSeconds`, then the renewals stop, so the request goes idle and
    another replica's `consume` takes it (with the liveness check left out: renewed for as long as the process
    lived)."""
    q, manifest = _queue(tmp_path, redis_client), _manifest(tmp_path, progressDeadlineSeconds=4)
    _request(q, 0)
    (tmp_path / "gate-rollout-0").touch()
    proc = _rollout("rollout-0", manifest, redis_url, sender.port, tmp_path)
    try:
        wait_until(lambda: _pending(q), "rollout-0 to take the request", 120)
        idle = []
        for _ in range(10):  # live for 3 s at least (a beat is written at most once a second)
            time.sleep(0.25)
            idle.append(_idle_ms(q))
        assert max(idle) < 1500, idle  # renewed every 0.67 s
        wait_until(lambda: _idle_ms(q) > 2000 * CLAIM_IDLE_S, "the claim to lapse", 30)
        assert "rollout-0: not live, its claim on 1 entries" in (tmp_path / "rollout-0.log").read_text()
    finally:
        proc.kill()
        proc.wait(30)
    q.cleanup()
