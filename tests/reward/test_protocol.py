"""The scorer protocol over real sockets: `omnirl scorer serve` processes (gRPC and the HTTP/JSON
twin) against our clients, the gRPC health check, retries and malformed answers."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from omnirl.api.exits import USAGE_EXIT
from omnirl.models.digits.render import render_text
from omnirl.reward import ScorerError
from omnirl.reward.jpeg import JPEGCompressibilityScorer
from omnirl.reward.ocr import OCRScorer
from omnirl.reward.protocol.codec import answer, build_request, from_json, pb2, to_json
from omnirl.reward.remote import GRPCScorer, HTTPScorer
from omnirl.reward.serve import serve_grpc
from omnirl.scorers.base import score_each

PROMPTS = ['A sign that says "2048"', 'A sign that says "731"', 'A sign that says "96054"', 'A sign that says "2047"']


@pytest.fixture(scope="module")
def digits() -> np.ndarray:
    """`[4, 32, 128, 3]` uint8: rendered 2048, 731, a blank and 2048 again."""
    rng = np.random.default_rng(0)
    rows = []
    for n in ["2048", "731", "", "2048"]:
        gray = render_text(n, 8, rng) if n else np.full((32, 128), 255, np.uint8)  # 8 slots: one width
        rows.append(np.repeat(gray[..., None], 3, axis=-1))
    return np.stack(rows)


def serve(*args: str) -> Iterator[tuple[subprocess.Popen, int]]:
    proc = subprocess.Popen([sys.executable, "-m", "omnirl.cli", "scorer", "serve", "--host", "127.0.0.1",
                             "--port", "0", *args], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving "), line
        yield proc, int(line.rsplit(":", 1)[1])
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0  # SIGTERM is a clean stop


@pytest.fixture(scope="module")
def grpc_ocr() -> Iterator[tuple[subprocess.Popen, int]]:
    yield from serve("--reward", "ocr", "--protocol", "grpc")


@pytest.fixture(scope="module")
def http_ocr() -> Iterator[tuple[subprocess.Popen, int]]:
    yield from serve("--reward", "ocr", "--protocol", "http")


@pytest.fixture(scope="module")
def expected(digits) -> np.ndarray:
    return OCRScorer().score(digits, PROMPTS, ["a", "b", "c", "d"])


def test_grpc_server_scores_like_in_process(grpc_ocr, digits, expected):
    _, port = grpc_ocr
    client = GRPCScorer("ocr", f"127.0.0.1:{port}")
    outcome = client.score_each(digits, PROMPTS, ["a", "b", "c", "d"])
    assert outcome.errors == {}
    assert outcome.values.tolist() == expected.tolist() and expected.tolist() == [1.0, 1.0, 0.0, 0.75]
    client.close()


def test_http_twin_scores_like_in_process(http_ocr, digits, expected):
    _, port = http_ocr
    client = HTTPScorer("ocr", f"http://127.0.0.1:{port}/v1/score")
    assert client.score(digits, PROMPTS, ["a", "b", "c", "d"]).tolist() == expected.tolist()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=30) as resp:
        assert json.loads(resp.read()) == {"status": "SERVING", "scorer": "ocr"}


def test_a_bad_sample_fails_alone_over_both_protocols(grpc_ocr, http_ocr, digits):
    prompts = [PROMPTS[0], 'A sign that says "12', PROMPTS[2], PROMPTS[3]]
    for client in (GRPCScorer("ocr", f"127.0.0.1:{grpc_ocr[1]}"), HTTPScorer("ocr", f"http://127.0.0.1:{http_ocr[1]}/v1/score")):
        outcome = client.score_each(digits, prompts, ["a", "b", "c", "d"])
        assert list(outcome.errors) == [1] and outcome.errors[1].sample_id == "b"
        assert "one double quote" in outcome.errors[1].reason
        assert outcome.values[[0, 2, 3]].tolist() == [1.0, 0.0, 0.75]
        with pytest.raises(ScorerError, match="one double quote"):
            client.score(digits, prompts, ["a", "b", "c", "d"])


def test_grpc_health_check_answers_serving(grpc_ocr):
    with grpc.insecure_channel(f"127.0.0.1:{grpc_ocr[1]}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "omnirl.scorer.v1.Scorer"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=30)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_malformed_requests_are_rejected(grpc_ocr, http_ocr):
    with grpc.insecure_channel(f"127.0.0.1:{grpc_ocr[1]}") as channel:
        from omnirl.reward.protocol.codec import pb2_grpc

        with pytest.raises(grpc.RpcError) as err:
            pb2_grpc.ScorerStub(channel).Score(pb2.ScoreRequest(), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "no samples" in err.value.details()
    for body in (b"{not json", b'{"samples": [{"sample_id": "a", "colour": 1}]}'):
        req = urllib.request.Request(f"http://127.0.0.1:{http_ocr[1]}/v1/score", data=body)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=30)
        assert err.value.code == 400


def test_undecodable_image_fails_its_sample_on_the_server():
    scorer = JPEGCompressibilityScorer()
    request = build_request(np.zeros((1, 8, 8, 3), np.uint8), ["p"], ["ok"])
    request.samples.add(sample_id="bad", prompt="p", image_png=b"\x89PNG not really")
    response = answer(scorer, from_json(to_json(request), pb2.ScoreRequest))  # through the JSON twin's mapping
    assert response.results[0].WhichOneof("outcome") == "score" and response.results[0].score < 0
    assert response.results[1].WhichOneof("outcome") == "error" and "not a readable image" in response.results[1].error


def test_unreachable_grpc_server_is_retried_then_fails_every_sample():
    client = GRPCScorer("judge", "127.0.0.1:9", timeout_s=5, max_retries=1)
    outcome = score_each(client, np.zeros((2, 8, 8, 3), np.uint8), ["x", "y"], ["a", "b"])
    assert set(outcome.errors) == {0, 1}
    assert "UNAVAILABLE" in outcome.errors[0].reason and "after 2 attempt(s)" in outcome.errors[0].reason
    # the sample's failure reason names the reward once (the scorer's own reason already starts with it)
    from omnirl.api.spec import RewardSpec
    from omnirl.reward.scoring import combine

    spec = RewardSpec.model_validate({"name": "judge", "kind": "grpc", "url": "127.0.0.1:9"})
    reward, _, reason = combine([spec], {"judge": outcome}, 0)
    assert reward is None and reason.startswith("judge: 127.0.0.1:9 unreachable") and "judge: judge:" not in reason
    assert ScorerError("s", "no text").named("ocr") == "ocr: no text"


class _NaNScorer:
    name = "nan"

    def score(self, images, prompts, sample_ids):
        return np.array([0.5, np.nan], dtype=np.float32)[: len(sample_ids)]


def test_a_non_finite_score_from_the_server_is_an_error():
    server, port = serve_grpc(_NaNScorer())
    try:
        outcome = GRPCScorer("nan", f"127.0.0.1:{port}").score_each(np.zeros((2, 4, 4, 3), np.uint8), ["", ""], ["a", "b"])
    finally:
        server.stop(grace=None)
    assert outcome.values[0] == 0.5 and list(outcome.errors) == [1] and "not finite" in outcome.errors[1].reason


class _Flaky(BaseHTTPRequestHandler):
    """HTTP twin that answers 503 to the first `fail` POSTs, then `reply` (or JPEG scores)."""

    fail = 0
    posts = 0
    reply: bytes | None = None

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).posts += 1
        if type(self).posts <= type(self).fail:
            status, data = 503, b'{"error": "warming up"}'
        elif self.reply is not None:
            status, data = 200, self.reply
        else:
            request = from_json(json.loads(body), pb2.ScoreRequest)
            status, data = 200, json.dumps(to_json(answer(JPEGCompressibilityScorer(), request))).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture()
def flaky() -> Iterator[type[_Flaky]]:
    handler = type("Handler", (_Flaky,), {"fail": 0, "posts": 0, "reply": None})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}/v1/score"
    yield handler
    server.shutdown()


def test_http_5xx_is_retried_then_succeeds(flaky):
    flaky.fail = 2
    rewards = HTTPScorer("jpeg", flaky.url, max_retries=2).score(np.zeros((1, 8, 8, 3), np.uint8), ["p"], ["a"])
    assert flaky.posts == 3 and rewards[0] < 0
    flaky.posts, flaky.fail = 0, 5
    with pytest.raises(ScorerError, match=r"HTTP 503.*warming up.*after 2 attempt") as err:
        HTTPScorer("jpeg", flaky.url, max_retries=1).score(np.zeros((1, 8, 8, 3), np.uint8), ["p"], ["a"])
    assert flaky.posts == 2 and err.value.sample_id == ""


@pytest.mark.parametrize("reply, match", [(b"<html>oops</html>", "malformed body.*<html>oops"),
                                          (b'{"results": [{"sample_id": "zzz", "score": 1}]}', "answered samples"),
                                          (b'{"rewards": [1.0]}', "malformed body.*rewards")])
def test_http_malformed_answers_are_errors_with_the_text(flaky, reply, match):
    flaky.reply = reply
    with pytest.raises(ScorerError, match=match):
        HTTPScorer("jpeg", flaky.url, max_retries=0).score(np.zeros((1, 8, 8, 3), np.uint8), ["p"], ["a"])


def test_scorer_serve_rejects_bad_params_naming_them():
    proc = subprocess.run([sys.executable, "-m", "omnirl.cli", "scorer", "serve", "--reward", "jpeg", "--port", "0",
                           "--param", "quality=100"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == USAGE_EXIT
    assert "params.quality: 100 is invalid: must be <= 95" in proc.stderr
