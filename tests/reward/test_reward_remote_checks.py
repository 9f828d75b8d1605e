"""`kind: http` and `kind: grpc` scorers that are slow rather than away, and their pre-flight, against
real `omnirl scorer serve` processes and real sockets."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml
from tests.reward.test_protocol import serve

from omnirl.api.spec import RewardSpec
from omnirl.reward.registry import build_scorer, check_judges
from omnirl.scorers.base import score_each

ROOT = Path(__file__).resolve().parents[2]
DELAY_S = 1.2


@pytest.fixture(scope="module")
def slow_http() -> Iterator[int]:
    """Port of a JPEG scorer over HTTP that sleeps DELAY_S per sample."""
    for _, port in serve("--reward", "jpeg", "--protocol", "http", "--delay-ms", str(int(DELAY_S * 1000))):
        yield port


@pytest.fixture(scope="module")
def slow_grpc() -> Iterator[int]:
    """Port of a JPEG scorer over gRPC that sleeps DELAY_S per sample."""
    for _, port in serve("--reward", "jpeg", "--protocol", "grpc", "--delay-ms", str(int(DELAY_S * 1000))):
        yield port


def url_of(kind: str, port: int, path: str = "/v1/score") -> str:
    return f"http://127.0.0.1:{port}{path}" if kind == "http" else f"127.0.0.1:{port}"


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_a_scorer_slower_than_its_timeout_fails_at_once_with_the_time_a_request_takes(kind, request):
    """Every attempt ran out of time, but the server answers an empty request at once: it is up and
    slower than `timeoutSeconds`, so the batch fails (not held), naming the field and one attempt's
    time, measured with a longer timeout (at least its own DELAY_S; more, as it queues behind the
    abandoned attempt the server still scores)."""
    port = request.getfixturevalue(f"slow_{kind}")
    spec = RewardSpec(name="judge", kind=kind, url=url_of(kind, port), timeoutSeconds=0.4, params={"maxRetries": 0})
    outcome = score_each(build_scorer(spec, field="spec.reward[2]"), np.zeros((1, 8, 8, 3), np.uint8), ["x"], ["s0"])
    err = outcome.errors[0]
    assert not err.unavailable
    head = f"judge: {url_of(kind, port)} is up (it answered an empty request in "
    tail = " but slower than spec.reward[2].timeoutSeconds 0.4: 1 attempt(s) timed out and one request took "
    assert err.reason.startswith(head) and tail in err.reason, err.reason
    assert float(err.reason.split(tail)[1].split(" s ")[0]) >= DELAY_S
    assert "; set spec.reward[2].timeoutSeconds above that, e.g. " in err.reason


def test_a_scorer_that_takes_connections_but_answers_nothing_is_held():
    """A port that accepts connections and never replies (a server stuck or starting) is away: held."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        spec = RewardSpec(name="judge", kind="http", url=url_of("http", silent.getsockname()[1]), timeoutSeconds=0.3,
                          params={"maxRetries": 0})
        outcome = score_each(build_scorer(spec), np.zeros((1, 8, 8, 3), np.uint8), ["x"], ["s0"])
    assert outcome.errors[0].unavailable and "timed out (after 1 attempt(s))" in outcome.errors[0].reason


def job(tmp_path: Path, reward: dict) -> str:
    """The NFT example plus `reward` as spec.reward[1] (its prompt files made absolute)."""
    doc = yaml.safe_load((ROOT / "examples" / "ocr-nft.yaml").read_text())
    doc["spec"]["data"] = {k: str(ROOT / "examples" / v) for k, v in doc["spec"]["data"].items()}
    doc["spec"]["reward"].append({"name": "judge", "weight": 0.5, **reward})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


PREFLIGHT = {  # kind, url ({port}: the slow HTTP scorer's) → the start of `omnirl run`'s one line
    "http-nothing-there": ("http", "http://127.0.0.1:9/v1/score",
                           "spec.reward[1].url: the scorer at http://127.0.0.1:9/v1/score does not answer "
                           "(ConnectionRefusedError: [Errno 111] Connection refused); start it, or fix url"),
    "http-wrong-path": ("http", "http://127.0.0.1:{port}/score",
                        "spec.reward[1].url: http://127.0.0.1:{port}/score answered HTTP 404 to a POST ('{{\"error\": "
                        "\"no such path /score; use POST /v1/score\"}}'); url must be the score endpoint of a scorer of "
                        "the protocol (omnirl scorer serve --protocol http: http://HOST:PORT/v1/score)"),
    "grpc-nothing-there": ("grpc", "127.0.0.1:9", "spec.reward[1].url: the scorer at 127.0.0.1:9 does not answer "
                                                  "(gRPC UNAVAILABLE: "),
    "grpc-at-an-http-port": ("grpc", "127.0.0.1:{port}", "spec.reward[1].url: 127.0.0.1:{port} answered gRPC "
                                                         "UNAVAILABLE ("),
}


@pytest.mark.parametrize("case", list(PREFLIGHT))
def test_run_refuses_a_scorer_url_where_no_scorer_answers(case, slow_http, tmp_path, capsys):
    """`omnirl run`'s pre-flight sends each http/grpc scorer an empty request: nothing there, or
    something that is not a scorer's endpoint, is one line naming the field and the fix, exit 2,
    before the run directory is made (before, the first batch was held for scorerOutageSeconds)."""
    from omnirl.cli import main

    kind, url, line = PREFLIGHT[case]
    url, line = url.format(port=slow_http), line.format(port=slow_http)
    out = tmp_path / "o"
    out.write_text("")  # refused right after the pre-flight: without it, this test would not start a whole job
    code = main(["run", job(tmp_path, {"kind": kind, "url": url}), "--no-ray", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"omnirl run: {line}"), err


def test_eval_refuses_a_scorer_that_does_not_answer(tmp_path, capsys):
    from omnirl.cli import main

    heldout = str(ROOT / "examples" / "prompts" / "ocr-heldout.txt")
    path = job(tmp_path, {"kind": "grpc", "url": "127.0.0.1:9"})
    code = main(["eval", path, "--prompts", heldout, "--out", str(tmp_path / "e")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("omnirl eval: spec.reward[1].url: the scorer at 127.0.0.1:9 does not answer"), err


def test_a_reward_worker_refuses_a_wrong_path_but_not_a_scorer_still_away(slow_http, slow_grpc):
    """A reward worker's own check (the only one on Kubernetes, strict=False): an answer that is not a
    scorer's comes back the same every time and is refused; nothing answering yet (a scorer still
    starting) is not: its samples wait for it. Right urls pass both checks."""
    def check(kind: str, url: str, strict: bool = False) -> None:
        check_judges([RewardSpec(name="ocr", kind="jpeg"), RewardSpec(name="judge", kind=kind, url=url)], strict=strict)

    with pytest.raises(ValueError, match=r"^spec.reward\[1\].url: http://127.0.0.1:\d+/score answered HTTP 404 "):
        check("http", url_of("http", slow_http, "/score"))
    check("http", "http://127.0.0.1:9/v1/score")
    check("grpc", "127.0.0.1:9")
    for strict in (False, True):
        check("http", url_of("http", slow_http), strict)
        check("grpc", url_of("grpc", slow_grpc), strict)


def test_a_grpc_server_that_is_not_a_scorer_is_refused_by_run_and_by_the_worker():
    """A gRPC server without the Scorer service (here one serving only the health check) answers
    UNIMPLEMENTED, every time: refused by both checks, naming url and what it must be."""
    from concurrent import futures

    import grpc
    from grpc_health.v1 import health, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        for strict in (True, False):
            with pytest.raises(ValueError, match=rf"^spec.reward\[0\].url: 127.0.0.1:{port} answered gRPC UNIMPLEMENTED "
                                                 r".* to omnirl.scorer.v1.Scorer/Score; url must be host:port of a "
                                                 r"scorer of the protocol"):
                check_judges([RewardSpec(name="judge", kind="grpc", url=f"127.0.0.1:{port}")], strict=strict)
    finally:
        server.stop(grace=None)


def test_kind_http_at_a_grpc_scorer_is_refused_naming_url_and_kind(slow_grpc):
    """`kind: http` with the url of a gRPC scorer: the HTTP/2 server's reply is no HTTP/1.1 status line
    (http.client.BadStatusLine reached the user as a traceback); refused by both checks, every time."""
    url = f"http://127.0.0.1:{slow_grpc}/v1/score"
    for strict in (True, False):
        with pytest.raises(ValueError) as err:
            check_judges([RewardSpec(name="judge", kind="http", url=url)], strict=strict)
        assert str(err.value) == (
            f"spec.reward[0].url: {url} answers, but not in HTTP/1.1 (BadStatusLine: its first reply line is not an "
            "HTTP status line); a gRPC scorer (omnirl scorer serve --protocol grpc) is kind: grpc with url "
            "HOST:PORT; kind: http needs the score endpoint of an HTTP scorer (http://HOST:PORT/v1/score)")


def test_kind_grpc_at_an_http_scorer_is_refused_not_held(slow_http):
    """`kind: grpc` with the host:port of an HTTP scorer: gRPC reads its HTTP/1.1 reply as UNAVAILABLE,
    which the reward worker's check (the only one on Kubernetes) took for a scorer still starting, and
    the samples were held for scorerOutageSeconds; it answers, so both checks refuse it at once."""
    url = f"127.0.0.1:{slow_http}"
    for strict in (True, False):
        with pytest.raises(ValueError, match=rf"^spec.reward\[0\].url: {url} answered gRPC UNAVAILABLE \(.*Failed "
                                             r"parsing HTTP/2.*\) to omnirl.scorer.v1.Scorer/Score; url must be "
                                             r"host:port of a scorer of the protocol .*, not another gRPC or HTTP "
                                             r"server$"):
            check_judges([RewardSpec(name="judge", kind="grpc", url=url)], strict=strict)
