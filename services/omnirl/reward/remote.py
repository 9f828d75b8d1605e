"""Clients of a scorer server (`kind: grpc` and `kind: http`), one protocol: `protocol/scorer.proto`.

`GRPCScorer` calls `omnirl.scorer.v1.Scorer/Score`; `HTTPScorer` POSTs the same request in proto3's
JSON mapping to the twin endpoint (`omnirl scorer serve --protocol http` serves `POST /v1/score`).
Each sample comes back with a score or an error. A batch is retried after a connection error, a
timeout, HTTP 408/429/5xx or gRPC UNAVAILABLE/RESOURCE_EXHAUSTED/DEADLINE_EXCEEDED, `max_retries`
times with exponential backoff (0.5 s · 2^k, at most 8 s, as the openai client does); after that,
or on any other failure, every sample of the batch fails with the reason — never a reward of 0.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import grpc
import numpy as np

from omnirl.reward.base import Outcome, PerSampleScorer, ScorerError, check_batch
from omnirl.reward.protocol.codec import build_request, from_json, pb2, pb2_grpc, read_response, to_json

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""gRPC message size limit both ways (a batch of 64 PNGs at 1024² fits)."""
RETRY_HTTP_STATUS = frozenset({408, 429}) | frozenset(range(500, 600))
RETRY_GRPC_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                              grpc.StatusCode.DEADLINE_EXCEEDED})


class Retryable(Exception):
    """A transient failure of one attempt (the batch is sent again)."""


def backoff_s(attempt: int) -> float:
    """Seconds to wait before retry number `attempt` (0-based): min(0.5 · 2^attempt, 8)."""
    return min(0.5 * 2.0**attempt, 8.0)


def with_retries(call: Callable[[], Outcome], max_retries: int, describe: str) -> Outcome:
    """Run `call` until it returns, retrying a `Retryable` failure up to `max_retries` times.

    Raises:
        ScorerError: (sample id "", `unavailable`) the last attempt failed; the reason names the attempts made.
    """
    for attempt in range(max_retries + 1):
        try:
            return call()
        except Retryable as err:
            if attempt == max_retries:
                raise ScorerError("", f"{describe}: {err} (after {attempt + 1} attempt(s))", unavailable=True) from err
            time.sleep(backoff_s(attempt))
    raise AssertionError("unreachable")


class GRPCScorer(PerSampleScorer):
    """Scores over gRPC (`kind: grpc`).

    Args:
        name: reward name (metric label, error prefix).
        target: `host:port` of an `omnirl scorer serve --protocol grpc` (or any Scorer service).
        timeout_s: deadline of one attempt, seconds.
        max_retries: retries of a transiently failed batch.
    """

    def __init__(self, name: str, target: str, *, timeout_s: float = 30.0, max_retries: int = 2) -> None:
        self.name, self.target, self.timeout_s, self.max_retries = name, target, timeout_s, max_retries
        options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        self.channel = grpc.insecure_channel(target, options=options)
        self.stub = pb2_grpc.ScorerStub(self.channel)

    def score_each(self, images: np.ndarray, prompts: list[str], sample_ids: list[str]) -> Outcome:
        """One score or error per sample (see `omnirl.reward.base.PerSampleScorer`)."""
        check_batch(images, prompts, sample_ids)
        request = build_request(images, prompts, sample_ids)

        def attempt() -> Outcome:
            try:
                response = self.stub.Score(request, timeout=self.timeout_s)
            except grpc.RpcError as err:
                reason = f"gRPC {err.code().name}: {err.details()}"
                if err.code() in RETRY_GRPC_CODES:
                    raise Retryable(reason) from err
                raise ScorerError("", f"{self.name}: {self.target} failed: {reason}") from err
            return read_response(self.name, self.target, response, sample_ids)

        return with_retries(attempt, self.max_retries, f"{self.name}: {self.target} unreachable")

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()


class HTTPScorer(PerSampleScorer):
    """Scores over the HTTP/JSON twin (`kind: http`): POST `ScoreRequest` JSON to `url`.

    Args:
        name: reward name (metric label, error prefix).
        url: the score endpoint, e.g. `http://ocr-scorer:8000/v1/score`.
        timeout_s: timeout of one attempt, seconds.
        max_retries: retries of a transiently failed batch.
    """

    def __init__(self, name: str, url: str, *, timeout_s: float = 30.0, max_retries: int = 2) -> None:
        self.name, self.url, self.timeout_s, self.max_retries = name, url, timeout_s, max_retries

    def score_each(self, images: np.ndarray, prompts: list[str], sample_ids: list[str]) -> Outcome:
        """One score or error per sample (see `omnirl.reward.base.PerSampleScorer`)."""
        check_batch(images, prompts, sample_ids)
        body = json.dumps(to_json(build_request(images, prompts, sample_ids))).encode()
        request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})

        def attempt() -> Outcome:
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                    raw = resp.read()
            except urllib.error.HTTPError as err:
                reason = f"HTTP {err.code}: {err.read()[:300].decode(errors='replace')}"
                if err.code in RETRY_HTTP_STATUS:
                    raise Retryable(reason) from err
                raise ScorerError("", f"{self.name}: {self.url} failed: {reason}") from err
            except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
                raise Retryable(str(getattr(err, "reason", err))) from err
            try:
                response = from_json(json.loads(raw), pb2.ScoreResponse)
            except ValueError as err:  # json.JSONDecodeError is a ValueError
                raise ScorerError("", f"{self.name}: {self.url} returned a malformed body ({err}): "
                                      f"{raw[:300].decode(errors='replace')!r}") from err
            return read_response(self.name, self.url, response, sample_ids)

        return with_retries(attempt, self.max_retries, f"{self.name}: {self.url} unreachable")
