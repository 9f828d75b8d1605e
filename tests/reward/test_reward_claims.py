"""Two real reward replicas (`omnirl role reward` processes) on a real redis-server, while their judge
answers 503 for longer than `claimIdleSeconds`: the replica holding the samples keeps its claim on them
(each delivered once, none reclaimed by the idle replica), and once it is SIGKILLed they go to the other,
which scores each exactly once when the judge is back.

Before the fix the idle replica reclaimed the held samples claimIdleSeconds into the outage and both held
them: each sample was delivered twice and, once the judge was back, scored twice by it (measured with
claimIdleSeconds 1 and an 8 s outage: judge scorings 2 per sample, published scores 1)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
import yaml
from tests.helpers import wait_until
from tests.reward.test_queue_reward_fetch import _sample

from omnirl.transfer import TransferQueue

ROOT = Path(__file__).resolve().parents[2]
JOB, N = "claims", 4
CLAIM_IDLE_S = 2  # renewed every 0.67 s: a 1.3 s stall of the shared CI box would be needed to lose it


class _Judge(BaseHTTPRequestHandler):
    """The scorer protocol's HTTP twin: 503 (restarting) while `up` is unset, else 0.5 per sample;
    counts per sample id the requests it refused and the scores it gave."""

    up = threading.Event()
    refused: Counter = Counter()
    scored: Counter = Counter()

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        ids = [s["sample_id"] for s in json.loads(self.rfile.read(int(self.headers["Content-Length"])))["samples"]]
        if not self.up.is_set():
            self.refused.update(ids)
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b"restarting")
            return
        self.scored.update(ids)
        body = json.dumps({"results": [{"sample_id": i, "score": 0.5} for i in ids]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve_judge(up: bool):
    """The counting judge on a free port, its counts cleared, answering 503 until `_Judge.up` is set."""
    (_Judge.up.set if up else _Judge.up.clear)()
    _Judge.refused.clear()
    _Judge.scored.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture()
def judge():
    yield from serve_judge(up=False)


def _manifest(tmp_path: Path, judge_port: int) -> Path:
    doc = yaml.safe_load((ROOT / "examples" / "ocr-flowgrpo.yaml").read_text())
    doc["metadata"]["name"] = JOB
    for key in ("trainPrompts", "validationPrompts"):
        doc["spec"]["data"][key] = str(ROOT / "examples" / doc["spec"]["data"][key])
    doc["spec"]["reward"] = [{"name": "judge", "kind": "http", "url": f"http://127.0.0.1:{judge_port}/v1/score",
                              "params": {"maxRetries": 0}}]
    doc["spec"]["failurePolicy"] = {"scorerOutageSeconds": 600}
    doc["spec"]["transferQueue"] = {"claimIdleSeconds": CLAIM_IDLE_S}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _reward(worker: str, manifest: Path, redis_url: str, out: Path) -> subprocess.Popen:
    env = {**os.environ, "OMNIRL_JOB_NAME": JOB, "OMNIRL_REDIS_URL": redis_url, "OMNIRL_WORKER_ID": worker,
           "OMNIRL_OUT": str(out), "OMNIRL_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "omnirl.cli", "role", "reward", "--job", str(manifest)], env=env,
                            stdout=subprocess.DEVNULL, stderr=(out / f"{worker}.log").open("w"))


def _pending(q: TransferQueue) -> dict[str, tuple[str, int]]:
    """entry id → (owner, times delivered) of the reward group's pending samples."""
    return {e["message_id"].decode(): (e["consumer"].decode(), e["times_delivered"])
            for e in q.redis.xpending_range(q.streams.samples, "reward", "-", "+", 100)}


def test_a_held_sample_stays_claimed_through_an_outage_and_is_scored_once(tmp_path, redis_url, redis_client, judge):
    manifest = _manifest(tmp_path, judge.server_port)
    q = TransferQueue(redis_client, JOB)
    g = torch.Generator().manual_seed(0)
    for i in range(N):
        meta, trajectory, image = _sample(i, g)
        q.publish(q.streams.samples, meta, trajectory, image=image, done_kind="rollout")
    q.ensure_group(q.streams.samples, "reward")
    procs = {"reward-0": _reward("reward-0", manifest, redis_url, tmp_path)}
    try:
        wait_until(lambda: len(_pending(q)) == N, "reward-0 to take the samples", timeout_s=120)
        procs["reward-1"] = _reward("reward-1", manifest, redis_url, tmp_path)
        wait_until(lambda: q.redis.exists(f"omnirl:{JOB}:kv:heartbeat:reward-1"), "reward-1's first beat", 120)
        # reward-1 now consumes every 200 ms; the judge stays away for 3 claimIdleSeconds more
        seen = set()
        for _ in range(12):
            time.sleep(CLAIM_IDLE_S / 4)
            seen |= set(_pending(q).values())
        assert seen == {("reward-0", 1)}  # before the fix: ("reward-1", 2) from claimIdleSeconds on
        assert _Judge.scored == Counter() and set(_Judge.refused) == {f"0:0:{i}" for i in range(N)}

        # a replica that dies releases its claim: the other reclaims the samples claimIdleSeconds later
        procs["reward-0"].send_signal(signal.SIGKILL)
        procs["reward-0"].wait(30)
        wait_until(lambda: set(_pending(q).values()) == {("reward-1", 2)}, "reward-1 to reclaim the samples", 60)
        _Judge.up.set()
        wait_until(lambda: q.stream_length(q.streams.scores) == N and not _pending(q), "the scores", 120)
        q.set_json("stop", True)
        assert procs["reward-1"].wait(60) == 0
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    scores = q.consume(q.streams.scores, "c", "c", count=100, block_ms=0)
    assert Counter(m.meta["sample_id"] for m in scores) == {f"0:0:{i}": 1 for i in range(N)}
    assert _Judge.scored == {f"0:0:{i}": 1 for i in range(N)}
    assert all(m.meta["reward"] == 0.5 and not m.meta["failed"] for m in scores)
    lines = [json.loads(line) for line in (tmp_path / "ledger" / "reward-reward-1.jsonl").read_text().splitlines()]
    assert sorted(line["sample_id"] for line in lines) == [f"0:0:{i}" for i in range(N)]
    assert not (tmp_path / "ledger" / "reward-reward-0.jsonl").read_text()
    q.cleanup()
