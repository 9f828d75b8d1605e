"""A deterministic OpenAI-compatible chat-completions server, run by the tests as a real process.

`python tests/judge_server.py` listens on a free loopback port and prints `listening on PORT`.
It serves `POST /v1/chat/completions` and `GET /v1/models` in the OpenAI wire format, plus
`GET /stats` (every request it received and the most requests in flight at once per model, for
the tests' assertions).

Its "model" reads the answer from the first image it is sent (a base64 PNG data URL), so a test
controls the reply through pixels alone: the text is the ASCII codes in the red channel of the
first row, up to the first 0. A request with sound and no image is answered with the WAV's peak
amplitude (`heard_text`). `GET /stats` also counts each request's images and sound parts. With `logprobs` requested, the text is a probability p and the
reply is one token `yes` with top log-probabilities {yes: log p, no: log(1 − p), maybe: log 1e-3}.

The request's `model` selects a behaviour, to exercise a client's failure handling:
`judge` (the above), `judge-no-logprobs` (never returns logprobs), `slow:S` (sleeps S seconds
first), `flaky:N` (HTTP 503 to the first N requests per seed, then answers), `malformed` (HTTP 200
with a body that is not JSON), `no-choices` (HTTP 200 JSON without `choices`), `reject` (HTTP 400).

`--port N` listens on N (default: a free port). `--api-key KEY` makes it refuse, as `vllm serve --api-key` does, every `/v1/` request without
`Authorization: Bearer KEY` (HTTP 401). `--delay S` sleeps S seconds before answering every chat
completion, whatever the model (a big judge on a small GPU); `/v1/models` still answers at once.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import math
import sys
import threading
import time
import wave
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from PIL import Image

_lock = threading.Lock()
_requests: list[dict] = []
_attempts: Counter = Counter()
_in_flight: Counter = Counter()
_max_in_flight: Counter = Counter()
_api_key: str | None = None
_delay_s = 0.0
SERVED = ["judge", "judge-no-logprobs", "malformed", "no-choices", "reject"]  # GET /v1/models (slow:S, flaky:N too)


def encoded_text(data_url: str) -> str:
    """The text the test wrote into the image's first row (red channel ASCII, 0-terminated)."""
    prefix = "data:image/png;base64,"
    if not data_url.startswith(prefix):
        raise ValueError(f"image_url is not a base64 PNG data URL: {data_url[:40]!r}")
    with Image.open(io.BytesIO(base64.b64decode(data_url[len(prefix):]))) as im:
        if im.format != "PNG":
            raise ValueError(f"image is {im.format}, expected PNG")
        row = np.asarray(im.convert("RGB"))[0, :, 0]
    end = int(np.argmax(row == 0)) if (row == 0).any() else len(row)
    return bytes(row[:end].tolist()).decode("ascii")


def heard_text(sound: dict) -> str:
    """A request without an image is answered from its sound (an `input_audio` part, base64 WAV): the peak |x| p
    as "p" (a probability, for logprobs) — or, for a rating, round(10·p) clipped to 1..10 — so a test controls the
    reply through the waveform's amplitude. Raises ValueError for a part that is not a 16-bit mono WAV."""
    if sound.get("format") != "wav":
        raise ValueError(f"input_audio format {sound.get('format')!r}, expected wav")
    with wave.open(io.BytesIO(base64.b64decode(sound["data"]))) as wav:
        if wav.getsampwidth() != 2 or wav.getnchannels() != 1:
            raise ValueError("input_audio is not 16-bit mono PCM")
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    peak = float(np.abs(pcm).max()) / 32767.0
    return f"{peak:.4f}"


def completion(model: str, content: str, logprobs: dict | None) -> dict:
    """An OpenAI chat.completion object with one choice."""
    return {
        "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "logprobs": logprobs, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: dict) -> None:
        self._send(status, json.dumps(obj).encode())

    def _refused(self) -> bool:
        """Answer 401 (vLLM's body) to a /v1/ request without the server's key; whether it did."""
        if _api_key is None or not self.path.startswith("/v1/") or \
                self.headers.get("Authorization") == f"Bearer {_api_key}":
            return False
        self.rfile.read(int(self.headers.get("Content-Length") or 0))  # the connection is kept alive
        self._json(401, {"error": "Unauthorized"})
        return True

    def do_GET(self) -> None:  # noqa: N802
        if self._refused():
            return
        if self.path == "/stats":
            with _lock:
                self._json(200, {"requests": _requests, "max_in_flight": dict(_max_in_flight)})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "tests"} for m in SERVED]})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:  # noqa: N802
        if self._refused():
            return
        if self.path != "/v1/chat/completions":
            self._json(404, {"error": {"message": f"no route {self.path}"}})
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        model, seed = body["model"], body.get("seed")
        with _lock:
            _attempts[(model, seed)] += 1
            _in_flight[model] += 1
            _max_in_flight[model] = max(_max_in_flight[model], _in_flight[model])
            attempt = _attempts[(model, seed)]
        try:
            self._complete(body, model, attempt)
        finally:
            with _lock:
                _in_flight[model] -= 1

    def _complete(self, body: dict, model: str, attempt: int) -> None:
        """Record the request and answer it as its model's behaviour says."""
        parts = body["messages"][0]["content"]
        images = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
        sounds = [p["input_audio"] for p in parts if p["type"] == "input_audio"]
        texts = [p["text"] for p in parts if p["type"] == "text"]
        question = texts[-1]
        with _lock:
            _requests.append({"model": model, "seed": body.get("seed"), "temperature": body.get("temperature"),
                              "max_tokens": body.get("max_tokens"), "logprobs": body.get("logprobs"),
                              "top_logprobs": body.get("top_logprobs"), "question": question, "texts": texts,
                              "images": len(images), "audio_formats": [a.get("format") for a in sounds],
                              "attempt": attempt, "retry_header": self.headers.get("x-stainless-retry-count"),
                              "authorization": self.headers.get("Authorization")})
        time.sleep(_delay_s)
        if model.startswith("slow:"):
            time.sleep(float(model.split(":")[1]))
        if model.startswith("flaky:") and attempt <= int(model.split(":")[1]):
            self._json(503, {"error": {"message": "overloaded, try again"}})
        elif model == "reject":
            self._json(400, {"error": {"message": "the model does not exist"}})
        elif model == "malformed":
            self._send(200, b'{"id": "chatcmpl-test", "choices": [{"mess')
        elif model == "no-choices":
            self._json(200, {"id": "chatcmpl-test", "object": "chat.completion"})
        else:
            try:
                text = encoded_text(images[0]) if images else heard_text(sounds[0])
            except (ValueError, IndexError, KeyError) as err:
                self._json(400, {"error": {"message": str(err)}})
                return
            logprobs = None
            if body.get("logprobs") and model != "judge-no-logprobs":
                p = float(text)
                top = [{"token": "yes", "logprob": math.log(p)}, {"token": "no", "logprob": math.log(1 - p)},
                       {"token": "maybe", "logprob": math.log(1e-3)}][: body.get("top_logprobs") or 1]
                logprobs = {"content": [{"token": "yes", "logprob": math.log(p), "top_logprobs": top}]}
                text = "yes"
            self._json(200, completion(model, text, logprobs))

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        """Quiet."""


def main() -> None:
    global _api_key, _delay_s
    parser = argparse.ArgumentParser()
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    _api_key, _delay_s = args.api_key, args.delay
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"listening on {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
