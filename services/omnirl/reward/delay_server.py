"""A small HTTP scorer with a configurable per-sample delay, for tests and benchmarks.

`python -m omnirl.reward.delay_server --port N [--reward jpeg|ocr] [--delay-ms D]` serves the
protocol of :class:`omnirl.reward.http.HTTPScorer` on every POST path (request
`{"prompts", "sample_ids", "images": [base64 PNG]}`, reply `{"rewards": [...]}`, a scorer error
as HTTP 422 `{"error": ...}`) and `GET /health` (200). Requests are served one at a time and each
sleeps `D` ms per sample before scoring, standing in for a judge model whose latency per sample
is `D` (a GPU judge serialises its batches the same way). It is what the tests and the
`async-reward` measurement use as a judge the job deploys itself; it is not a production server.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from PIL import Image

from omnirl.reward.base import Scorer, ScorerError


def _scorer(kind: str) -> Scorer:
    if kind == "ocr":
        from omnirl.reward.ocr import OCRScorer

        return OCRScorer()
    if kind == "jpeg":
        from omnirl.reward.jpeg import JPEGCompressibilityScorer

        return JPEGCompressibilityScorer()
    raise ValueError(f"--reward {kind!r}: use jpeg or ocr")


def _decode(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def make_server(port: int, scorer: Scorer, delay_s: float, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """The HTTP server (not started; call `serve_forever`). `delay_s`: sleep per sample, seconds."""
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._reply(200, {"status": "ok"}) if self.path == "/health" else self._reply(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            try:
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                images = np.stack([_decode(b) for b in req["images"]])
                with lock:
                    time.sleep(delay_s * len(images))
                    rewards = scorer.score(images, list(req["prompts"]), list(req["sample_ids"]))
            except ScorerError as err:
                self._reply(422, {"error": str(err)})
                return
            except (KeyError, ValueError, TypeError) as err:
                self._reply(400, {"error": f"bad request: {err}"})
                return
            self._reply(200, {"rewards": [float(r) for r in rewards]})

        def log_message(self, *args: object) -> None:  # one line per request would drown the job's log
            return

    return ThreadingHTTPServer((host, port), Handler)


def main(argv: list[str] | None = None) -> None:
    """Serve until killed (SIGTERM/SIGINT)."""
    p = argparse.ArgumentParser(prog="python -m omnirl.reward.delay_server", description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="0.0.0.0")  # noqa: S104 - a pod's server listens on its pod IP
    p.add_argument("--reward", default="jpeg", choices=["jpeg", "ocr"])
    p.add_argument("--delay-ms", type=float, default=0.0, help="sleep per sample, milliseconds")
    args = p.parse_args(argv)
    server = make_server(args.port, _scorer(args.reward), args.delay_ms / 1000.0, args.host)
    print(f"delay_server: {args.reward} on {args.host}:{args.port}, {args.delay_ms} ms per sample", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
