"""A reward worker waiting on a slow scorer stays alive to its supervisors.

A scorer that is up but slower than `timeoutSeconds` gets one measuring request of up to 10× the
timeout (60–300 s, `omnirl.reward.slow`); with its attempts and backoffs a batch can outlast
`failurePolicy.progressDeadlineSeconds`. The worker's heartbeat (what `omnirl run`'s supervisor and
the controller read in Redis, and the pod's gRPC liveness reads in-process) must go on meanwhile,
or the worker is killed and restarted as stuck, a restart counted, and measures again. Here a real
HTTP scorer on a loopback socket holds the measuring request until the worker has beaten past the
deadline (a real RewardService on a real redis-server)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import redis
from tests.reward.test_reward_hold import JOB, N, published, service

from omnirl.reward.protocol.codec import pb2, to_json
from omnirl.transfer import kv_key
from omnirl.transfer.heartbeat import Heartbeat, read_heartbeats, stale_roles

DEADLINE_S = 3.0  # failurePolicy.progressDeadlineSeconds, far below the 60 s the measuring request may take


class SlowScorer(ThreadingHTTPServer):
    """`POST /v1/score` of the scorer protocol: an empty request is answered at once (400, as
    `omnirl scorer serve` does: the server is up); one with samples is held until `release` is set,
    then scored 0.5 each. `measuring` is set, with its arrival time, when the second request with
    samples (the first is the attempt that timed out) arrives."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.release, self.measuring = threading.Event(), threading.Event()
        self.arrived: list[float] = []  # time.time() of each request with samples


class _Handler(BaseHTTPRequestHandler):
    server: SlowScorer

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        samples = body.get("samples") or []
        if not samples:
            self._send(400, {"error": "no samples"})
            return
        self.server.arrived.append(time.time())
        if len(self.server.arrived) == 2:
            self.server.measuring.set()
        self.server.release.wait(120)
        response = pb2.ScoreResponse(scorer="slow", results=[pb2.Result(sample_id=s["sample_id"], score=0.5)
                                                             for s in samples])
        self._send(200, to_json(response))

    def _send(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the attempt's client gave up at its timeout
            pass

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        """Quiet."""


def test_the_worker_beats_while_a_slow_scorer_is_measured(tmp_path, redis_url, redis_client):
    server = SlowScorer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    judge = {"name": "judge", "kind": "http", "url": f"http://127.0.0.1:{server.server_address[1]}/v1/score",
             "timeoutSeconds": 0.3, "params": {"maxRetries": 0}}
    worker, msgs, _ = service(tmp_path, redis_url, redis_client, 0, deadline_s=600, judge=judge,
                              policy={"progressDeadlineSeconds": DEADLINE_S})
    thread = threading.Thread(target=worker.score_batch, args=(msgs,))
    beyond = None
    try:
        thread.start()
        assert server.measuring.wait(120), "the scorer never got its measuring request"
        arrived = server.arrived[1]
        # the supervisor would call the worker stuck at arrived + DEADLINE_S: wait for a beat after that
        for _ in range(600):
            beat = read_heartbeats(redis_client, JOB).get("reward-0")
            if beat is not None and beat["t"] > arrived + DEADLINE_S + 1:
                beyond = beat
                break
            time.sleep(0.1)
        # what `omnirl run`'s supervisor and the controller conclude from it now, and the pod's probe
        stale = stale_roles(read_heartbeats(redis_client, JOB), DEADLINE_S, now=beyond["t"] if beyond else None)
        live = worker.heartbeat.age_s() <= DEADLINE_S
    finally:
        server.release.set()
        worker.terminate()  # a batch held instead (the scorer taken for away) returns at once
        thread.join(120)
        worker.close()
        server.shutdown()
        server.server_close()
    assert not thread.is_alive()
    assert beyond is not None, "no heartbeat while the measuring request was in flight: the worker looked stuck"
    assert stale == {} and live
    assert beyond["role"] == "reward" and beyond["progress"] == 0  # alive, not a finished batch
    assert len(server.arrived) == 2  # one attempt, one measuring request: the worker was not restarted
    scores = published(redis_client)
    assert len(scores) == N and all(s.failed for s in scores)
    assert "slower than spec.reward[0].timeoutSeconds 0.3: 1 attempt(s) timed out and one request took " in \
        scores[0].reason, scores[0].reason
    assert not [t for t in threading.enumerate() if t.name.startswith("heartbeat-")]  # the beating thread ended


def test_covering_beats_no_longer_than_its_bound(redis_client: redis.Redis):
    # a call stuck past its own bound must go stale again: the thread stops at the bound
    beat = Heartbeat(redis_client, "covering", "reward", "w-1", every_s=0.2)
    key = kv_key("covering", "heartbeat:w-1")
    redis_client.delete(key)
    with beat.covering(0.05):
        time.sleep(1.0)  # five beat periods past the bound
    assert redis_client.get(key) is None
    with beat.covering(60):
        for _ in range(300):
            if redis_client.get(key) is not None:
                break
            time.sleep(0.1)
    assert json.loads(redis_client.get(key))["worker"] == "w-1"
    assert not [t for t in threading.enumerate() if t.name == "heartbeat-w-1"]


def test_the_covered_time_is_the_scorers_worst_case():
    import numpy as np

    from omnirl.api.spec import RewardSpec
    from omnirl.reward.scoring import RewardSet

    # http: 3 attempts of 30 s + backoffs 0.5 + 1 s + the empty request (10 s) + the measuring one (300 s)
    specs = [RewardSpec(name="jpeg", kind="jpeg"),
             RewardSpec(name="judge", kind="http", url="http://127.0.0.1:1/v1/score", timeoutSeconds=30),
             RewardSpec(name="vlm", kind="vlm", url="http://127.0.0.1:1/v1", timeoutSeconds=30,
                        params={"model": "m", "template": "rate", "concurrency": 8, "batchSize": 16})]
    rewards = RewardSet(specs)
    http_s = 3 * 30 + 0.5 + 1 + 10 + 300
    # vlm, 20 images: waves of 16 and 4 at concurrency 8 = 3 rounds of requests of 4 attempts of 30 s and up
    # to 3 Retry-After waits of 120 s each, then its model list and the measuring request
    vlm_s = 3 * (4 * 30 + 3 * 120) + 10 + 300
    assert rewards.scorers["judge"].longest_call_s(20) == http_s
    assert rewards.scorers["vlm"].longest_call_s(20) == vlm_s
    images = [np.zeros((32, 64, 3), np.uint8)] * 19 + [np.zeros((32, 128, 3), np.uint8)]  # two calls per scorer
    one = [np.zeros((32, 64, 3), np.uint8)]
    assert rewards.longest_s(images) == http_s * 2 + vlm_s + (1 * (4 * 30 + 3 * 120) + 10 + 300)
    assert rewards.longest_s(one) == http_s + 1 * (4 * 30 + 3 * 120) + 10 + 300
    assert RewardSet(specs[:1]).longest_s(images) == 0  # in-process only: nothing covered
