"""`omnirl scorer serve`: any built-in scorer as a server of the scorer protocol.

`--protocol grpc` serves `omnirl.scorer.v1.Scorer` and the standard `grpc.health.v1.Health`
(SERVING once the scorer is loaded), so a Kubernetes gRPC probe works; `--protocol http` serves the
JSON twin: `POST /v1/score` (a `ScoreRequest` in proto3 JSON → a `ScoreResponse`) and `GET /healthz`.
A malformed request is gRPC INVALID_ARGUMENT / HTTP 400, answered at once even while a batch scores
(a request without samples is the clients' probe, `reward/remote.py`); a sample that cannot be
scored gets its error in the response. Scorer calls are serialised (scorers are not assumed thread-safe).
Once listening, the process prints one line `serving NAME over PROTOCOL on HOST:PORT` (with the
bound port, also for `--port 0`) and serves until SIGTERM or SIGINT. `--delay-ms D` sleeps D ms per
sample before scoring (requests are serialised, as a GPU judge serialises its batches): a stand-in
for a slow judge in tests and benchmarks.
"""

from __future__ import annotations

import argparse
import errno
import json
import signal
import socket
import sys
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from pydantic import ValidationError

from omnirl.api.errors import ManifestError
from omnirl.api.problems import problem_lines
from omnirl.api.spec import RewardSpec
from omnirl.reward.protocol.codec import answer, check_request, from_json, pb2, pb2_grpc, to_json
from omnirl.reward.registry import build_scorer
from omnirl.reward.remote import MAX_MESSAGE_BYTES
from omnirl.scorers.base import Scorer


class _Servicer(pb2_grpc.ScorerServicer):
    def __init__(self, scorer: Scorer) -> None:
        self.scorer, self.lock = scorer, threading.Lock()

    def Score(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 - the rpc's name
        try:
            check_request(request)  # outside the lock: a client's empty probe is answered while a batch scores
            with self.lock:
                return answer(self.scorer, request)
        except ValueError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))


def serve_grpc(scorer: Scorer, host: str = "127.0.0.1", port: int = 0, workers: int = 4) -> tuple[grpc.Server, int]:
    """Start a gRPC Scorer + Health server; returns `(server, bound port)`.

    Raises:
        RuntimeError: the address cannot be bound.
    """
    options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=options)
    pb2_grpc.add_ScorerServicer_to_server(_Servicer(scorer), server)
    checker = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise RuntimeError(f"cannot listen on {host}:{port}")
    server.start()
    for service in ("", "omnirl.scorer.v1.Scorer"):
        checker.set(service, health_pb2.HealthCheckResponse.SERVING)
    return server, bound


def _handler(scorer: Scorer) -> type[BaseHTTPRequestHandler]:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/healthz":
                self._send(200, {"status": "SERVING", "scorer": scorer.name})
            else:
                self._send(404, {"error": f"no such path {self.path}; use POST /v1/score or GET /healthz"})

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            if self.path != "/v1/score":
                self._send(404, {"error": f"no such path {self.path}; use POST /v1/score"})
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
                request = from_json(json.loads(self.rfile.read(length)), pb2.ScoreRequest)
                check_request(request)  # outside the lock: a client's empty probe is answered while a batch scores
                with lock:
                    response = answer(scorer, request)
            except ValueError as err:  # bad JSON, bad message, empty batch
                self._send(400, {"error": str(err)})
                return
            self._send(200, to_json(response))

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            """Quiet: one line per request would flood a job's logs."""

    return Handler


def serve_http(scorer: Scorer, host: str = "127.0.0.1", port: int = 0) -> tuple[ThreadingHTTPServer, int]:
    """Start the HTTP/JSON twin in a daemon thread; returns `(server, bound port)` (stop: `server.shutdown()`)."""
    server = ThreadingHTTPServer((host, port), _handler(scorer))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="scorer-http", daemon=True).start()
    return server, server.server_address[1]


def parse_param(text: str) -> tuple[str, str | int | float | bool]:
    """`KEY=VALUE` → (key, value as YAML would read it: `4` int, `0.5` float, `true` bool, else str).

    Raises:
        ValueError: no `=` in `text`.
    """
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--param {text!r}: write KEY=VALUE, e.g. --param alphabet=0123456789")
    for convert in (int, float):
        try:
            return key, convert(raw)
        except ValueError:
            pass
    return key, {"true": True, "false": False}.get(raw.lower(), raw)


class DelayedScorer(Scorer):
    """`scorer` after a sleep of `delay_s` seconds per sample (a slow judge for tests and benchmarks)."""

    def __init__(self, scorer: Scorer, delay_s: float) -> None:
        if delay_s < 0:
            raise ValueError(f"--delay-ms must be >= 0, got {delay_s * 1000:g}")
        self.inner, self.delay_s, self.name = scorer, delay_s, scorer.name

        self.modalities = getattr(scorer, "modalities", frozenset())  # a media scorer stays one

    def score(self, images, prompts, sample_ids):
        """As the inner scorer's `score`, `len(images) × delay_s` seconds later."""
        time.sleep(self.delay_s * len(images))
        return self.inner.score(images, prompts, sample_ids)

    def score_media(self, media, prompts, sample_ids):
        """As the inner scorer's `score_media`, `len(media) × delay_s` seconds later."""
        time.sleep(self.delay_s * len(media))
        return self.inner.score_media(media, prompts, sample_ids)


def check_address(host: str, port: int) -> None:
    """`--host HOST --port PORT` can be listened on, probed with a plain socket before the scorer loads (gRPC's own
    bind failure also prints its C-core log lines, and both servers' errors were all answered "choose a free port",
    also for a host that is not this machine's).

    Raises:
        ValueError: naming `--host` (unresolvable, or no address of this machine) or `--port` (in use, or refused)
            and the fix.
    """
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as err:
        raise ValueError(f"--host {host}: not an address ({err.strerror}); pass an address of this machine, "
                         "e.g. 127.0.0.1, or 0.0.0.0 for all interfaces (the default)") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do: TIME_WAIT is no conflict
        try:
            probe.bind(addr)
        except OSError as err:
            if err.errno == errno.EADDRNOTAVAIL:
                raise ValueError(f"--host {host}: not an address of this machine ({err.strerror}); pass one of its "
                                 "addresses, e.g. 127.0.0.1, or 0.0.0.0 for all interfaces (the default)") from None
            raise ValueError(f"--host {host} --port {port}: cannot listen there ({err.strerror}); choose a free "
                             "port, or --port 0 for any") from None


def main(args: argparse.Namespace) -> int:
    """`omnirl scorer serve`: build the scorer (params checked as in a manifest), serve until a signal."""
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port}: must be 0..65535 (0 picks a free port)")
    params = dict(parse_param(p) for p in args.param)
    kind = args.reward
    if getattr(args, "function", None):  # --function M:F is --reward python --param function=M:F
        kind, params = "python", {**params, "function": args.function}
    try:
        spec = RewardSpec.model_validate({"name": kind, "kind": kind, "params": params})
    except ValidationError as err:  # the CLI prints ManifestError's lines and exits 2
        lines = [f"--param {text}" for _, text in problem_lines(RewardSpec, err)]
        raise ManifestError([line.replace("--param params.function:", "--function:") if kind == "python" else line
                             for line in lines]) from None
    check_address(args.host, args.port)  # before the scorer's model loads
    try:
        scorer = build_scorer(spec)
    except ValueError as err:  # the function's import and checks (kind python) name the flag, not a manifest field
        if kind != "python":
            raise
        raise ValueError(str(err).replace(f"spec.reward[{kind}].params.function",
                                          "--function" if args.function else "--param function")) from None
    if getattr(args, "delay_ms", 0):
        scorer = DelayedScorer(scorer, args.delay_ms / 1000.0)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        if args.protocol == "grpc":
            server, port = serve_grpc(scorer, args.host, args.port)
            shutdown = lambda: server.stop(grace=2).wait()  # noqa: E731
        else:
            server, port = serve_http(scorer, args.host, args.port)
            shutdown = server.shutdown
    except (OSError, RuntimeError) as err:  # the port is taken or the address is not ours
        raise ValueError(f"--host {args.host} --port {args.port}: cannot listen there ({err}); "
                         "choose a free port, or --port 0 for any") from None
    print(f"serving {scorer.name} over {args.protocol} on {args.host}:{port}", flush=True)
    stop.wait()
    shutdown()
    print("stopped", file=sys.stderr, flush=True)
    return 0
