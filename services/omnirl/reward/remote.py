"""Clients of a scorer server (`kind: grpc` and `kind: http`), one protocol: `protocol/scorer.proto`.

`GRPCScorer` calls `omnirl.scorer.v1.Scorer/Score`; `HTTPScorer` POSTs the same request in proto3's
JSON mapping to the twin endpoint (`omnirl scorer serve --protocol http` serves `POST /v1/score`).
Each sample comes back with a score or an error. A batch is retried after a connection error, a
timeout, HTTP 408/429/5xx or gRPC UNAVAILABLE/RESOURCE_EXHAUSTED/DEADLINE_EXCEEDED, `max_retries`
times with exponential backoff (0.5 s · 2^k, at most 8 s, as the openai client does); after that,
or on any other failure, every sample of the batch fails with the reason — never a reward of 0.

A batch whose every attempt timed out asks the server an empty request (`probe_http`, `probe_grpc`:
answered, if at all, at once with HTTP 400 / INVALID_ARGUMENT): a server that answers it is up but
slower than `timeoutSeconds`, and the batch fails with the time one attempt takes, measured
(`omnirl.reward.slow`); one that does not is away and the batch is held (`ScorerError.unavailable`).
The same probe is the pre-flight of `omnirl run`/`omnirl eval` and of a reward worker (`check_remote`).
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from omnirl.reward.protocol.codec import (
    build_media_request,
    build_request,
    from_json,
    pb2,
    pb2_grpc,
    read_response,
    to_json,
)
from omnirl.reward.slow import longest_call_s, measure_timeout, probe_timeout, slow_reason
from omnirl.scorers.base import Outcome, PerSampleScorer, ScorerError, check_batch, raise_first

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""gRPC message size limit both ways (a batch of 64 PNGs at 1024² fits)."""
RETRY_HTTP_STATUS = frozenset({408, 429}) | frozenset(range(500, 600))
RETRY_GRPC_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                              grpc.StatusCode.DEADLINE_EXCEEDED})


class Retryable(Exception):
    """A transient failure of one attempt (the batch is sent again); `timed_out`: it ran out of time."""

    def __init__(self, reason: str, *, timed_out: bool = False) -> None:
        super().__init__(reason)
        self.timed_out = timed_out


def backoff_s(attempt: int) -> float:
    """Seconds to wait before retry number `attempt` (0-based): min(0.5 · 2^attempt, 8)."""
    return min(0.5 * 2.0**attempt, 8.0)


def with_retries(call: Callable[[float], Outcome], timeout_s: float, max_retries: int, describe: str,
                 slow: Callable[[Callable[[float], Outcome]], str | None] | None = None) -> Outcome:
    """Run `call(timeout_s)` until it returns, retrying a `Retryable` failure up to `max_retries` times.

    Args:
        slow: after a last attempt that timed out, the reason the batch fails if the server is up but
            slow (given `call`, to measure one attempt), else None (`RemoteScorer._slow_or_away`).
    Raises:
        ScorerError: (sample id "") the last attempt failed: `unavailable`, naming the attempts made,
            unless `slow` found the server up.
    """
    for attempt in range(max_retries + 1):
        try:
            return call(timeout_s)
        except Retryable as err:
            if attempt == max_retries:
                reason = slow(call) if err.timed_out and slow is not None else None
                if reason is not None:
                    raise ScorerError("", reason) from err
                raise ScorerError("", f"{describe}: {err} (after {attempt + 1} attempt(s))", unavailable=True) from err
            time.sleep(backoff_s(attempt))
    raise AssertionError("unreachable")


NOT_HTTP = -1  # probe_http's status when what answers does not speak HTTP/1.1 (a gRPC server's HTTP/2)


def probe_http(url: str, timeout_s: float) -> tuple[int | None, str]:
    """POST a `ScoreRequest` without samples (`{"samples": []}`) to `url`, once → (HTTP status, the
    body's start); 0 when the server took the request and closed the connection without a reply (up,
    but not fond of empty requests); (None, why) when nothing answered: refused, unknown host, timed
    out. A scorer of the protocol answers 400 (no samples) or 200; 404/405 mean `url` is not its
    score endpoint; `NOT_HTTP` when the reply is not HTTP/1.1 at all (a gRPC server)."""
    request = urllib.request.Request(url, data=b'{"samples": []}', headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return resp.status, resp.read(300).decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read(300).decode(errors="replace")
    except urllib.error.URLError as err:  # before a reply: connecting, resolving, sending
        return None, f"{type(err.reason).__name__}: {err.reason}"
    except TimeoutError as err:
        return None, f"TimeoutError: no reply within {timeout_s:g} s ({err})"
    except ConnectionError as err:  # http.client.RemoteDisconnected: it read the request, then hung up
        return 0, f"closed the connection without a reply ({type(err).__name__})"
    except http.client.HTTPException as err:  # BadStatusLine: something answered, in another protocol
        return NOT_HTTP, f"{type(err).__name__}: its first reply line is not an HTTP status line"


def probe_grpc(stub: Any, timeout_s: float) -> tuple[grpc.StatusCode | None, str]:
    """Call `Score` with an empty request through `stub`, once → (status code, details), or (None,
    why nothing answered: UNAVAILABLE, DEADLINE_EXCEEDED). A scorer answers INVALID_ARGUMENT (no
    samples); UNIMPLEMENTED means the server at the target is not one, and so does an UNAVAILABLE
    whose reply was not HTTP/2 (an HTTP/1.1 server, e.g. an HTTP scorer, answered)."""
    try:
        stub.Score(pb2.ScoreRequest(), timeout=timeout_s)
    except grpc.RpcError as err:
        details = str(err.details())
        # an HTTP/1.1 server (an HTTP scorer) answers too: gRPC cannot parse its reply as HTTP/2
        if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and \
                "Failed parsing HTTP/2" not in details:
            return None, f"gRPC {err.code().name}: {details}"
        return err.code(), details
    return grpc.StatusCode.OK, ""


def check_remote(field: str, kind: str, url: str, timeout_s: float, *, strict: bool = True) -> None:
    """Pre-flight of a `kind: http` or `kind: grpc` reward: an empty request to `url` (`probe_http`,
    `probe_grpc`) answers, and from a scorer of the protocol.

    Args:
        field: the reward's path, `spec.reward[i]`, for the messages.
        strict: False for a reward worker starting beside a scorer that may still be loading or
            restarting: only an answer from something that is not a scorer raises (it comes back
            the same every time); one that does not answer is left to the scoring (it holds samples).
    Raises:
        ValueError: naming `field.url` and the fix: nothing answers there (strict only), or what
            answers is not a scorer's endpoint (HTTP 404/405, a reply that is not HTTP/1.1; gRPC
            UNIMPLEMENTED or another error).
    """
    if kind == "http":
        status, text = probe_http(url, timeout_s)
        if status is None or status >= 500:
            if strict:
                why = text if status is None else f"HTTP {status}: {text!r}"
                raise ValueError(f"{field}.url: the scorer at {url} does not answer ({why}); start it, or fix url")
        elif status == NOT_HTTP:
            raise ValueError(f"{field}.url: {url} answers, but not in HTTP/1.1 ({text}); a gRPC scorer (omnirl "
                             "scorer serve --protocol grpc) is kind: grpc with url HOST:PORT; kind: http needs the "
                             "score endpoint of an HTTP scorer (http://HOST:PORT/v1/score)")
        elif status in (404, 405):
            raise ValueError(f"{field}.url: {url} answered HTTP {status} to a POST ({text!r}); url must be the score "
                             "endpoint of a scorer of the protocol (omnirl scorer serve --protocol http: "
                             "http://HOST:PORT/v1/score)")
        return
    channel = grpc.insecure_channel(url)
    try:
        code, text = probe_grpc(pb2_grpc.ScorerStub(channel), timeout_s)
    finally:
        channel.close()
    if code is None:
        if strict:
            raise ValueError(f"{field}.url: the scorer at {url} does not answer ({text}); start it, or fix url "
                             "(host:port of omnirl scorer serve --protocol grpc)")
    elif code not in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT):
        raise ValueError(f"{field}.url: {url} answered gRPC {code.name} ({text}) to omnirl.scorer.v1.Scorer/Score; "
                         "url must be host:port of a scorer of the protocol (omnirl scorer serve --protocol grpc), "
                         "not another gRPC or HTTP server")


@dataclass(frozen=True)
class MediaRequest:
    """What a remote scorer of video / audio is sent of each sample (`build_media_request`).

    Attributes:
        frame_stride: send every k-th frame; frame_count: send n evenly spaced frames (at most one of the two;
            neither: no video).
        audio: send the soundtrack.
    """

    frame_stride: int | None = None
    frame_count: int | None = None
    audio: bool = False

    @property
    def modalities(self) -> frozenset[str]:
        """The media keys it sends: "video" with frames, "audio" with the soundtrack."""
        video = self.frame_stride is not None or self.frame_count is not None
        return frozenset({"video"} if video else set()) | frozenset({"audio"} if self.audio else set())


class RemoteScorer(PerSampleScorer):
    """What the two clients share: the image and the media requests, and telling a slow server from an away one
    after a timeout. With a `MediaRequest` a client is a media scorer (`modalities`, `score_media_each`)."""

    name: str
    where: str
    field: str
    timeout_s: float
    max_retries: int
    media: MediaRequest | None = None
    modalities: frozenset[str] = frozenset()
    _measured: tuple[float | None] | None = None  # one attempt's measured time (None: > the cap), once per scorer

    def _set_media(self, media: MediaRequest | None) -> None:
        self.media = media
        self.modalities = media.modalities if media is not None else frozenset()

    def _score_request(self, request: Any, sample_ids: list[str]) -> Outcome:
        raise NotImplementedError

    def score_each(self, images: np.ndarray, prompts: list[str], sample_ids: list[str]) -> Outcome:
        """One score or error per image (see `omnirl.scorers.base.PerSampleScorer`)."""
        check_batch(images, prompts, sample_ids)
        return self._score_request(build_request(images, prompts, sample_ids), sample_ids)

    def score_media_each(self, media: list[dict], prompts: list[str], sample_ids: list[str]) -> Outcome:
        """One score or error per sample of video / audio: its frames and sound as the `MediaRequest` says.

        Raises:
            ScorerError: (sample id "") the scorer was built without a `MediaRequest`, or the whole call failed.
        """
        if self.media is None:
            raise ScorerError("", f"{self.name}: sends images only; set params.frameStride/frameCount or audio")
        try:
            request = build_media_request(media, prompts, sample_ids, frame_stride=self.media.frame_stride,
                                          frame_count=self.media.frame_count, audio=self.media.audio)
        except ScorerError as err:  # a sample without the media asked for fails alone
            outcome = Outcome(np.zeros(len(sample_ids), dtype=np.float32))
            outcome.errors = {i: err for i, sid in enumerate(sample_ids) if sid == err.sample_id}
            rest = [i for i in range(len(sample_ids)) if i not in outcome.errors]
            if rest:
                outcome.fill(rest, self.score_media_each([media[i] for i in rest], [prompts[i] for i in rest],
                                                         [sample_ids[i] for i in rest]))
            return outcome
        return self._score_request(request, sample_ids)

    def score_media(self, media: list[dict], prompts: list[str], sample_ids: list[str]) -> np.ndarray:
        """`[B]` float32 from `score_media_each`; the first failed sample raises its ScorerError."""
        return raise_first(self.score_media_each(media, prompts, sample_ids))

    def _answers(self, timeout_s: float) -> bool:
        """Whether the server answers an empty request within `timeout_s`."""
        raise NotImplementedError

    def longest_call_s(self, n: int) -> float:
        """The longest one `score_each` call (one request of `n` samples) can take, seconds: every
        attempt timing out, the backoffs between them, the empty request and the measuring one."""
        return longest_call_s(self.timeout_s, self.max_retries + 1, sum(backoff_s(k) for k in range(self.max_retries)))

    def _slow_or_away(self, call: Callable[[float], Outcome]) -> str | None:
        """After a batch's every attempt timed out: the reason it fails when the server answers an
        empty request (up, but slower than `timeoutSeconds`; one more attempt, given up to 10 × the
        timeout, is timed the first time), or None when it does not (away: the batch is held)."""
        start = time.monotonic()
        if not self._answers(probe_timeout(self.timeout_s)):
            return None
        answered_s = time.monotonic() - start
        if self._measured is None:  # once per scorer: a slow one would cost every batch one more slow attempt
            start = time.monotonic()
            try:
                call(measure_timeout(self.timeout_s))
                self._measured = (time.monotonic() - start,)
            except ScorerError:  # it answered (an error): the time is still its time
                self._measured = (time.monotonic() - start,)
            except Retryable as err:
                if not err.timed_out:
                    return None  # refused or 5xx now: going away, the hold finds out
                self._measured = (None,)
        took_s = self._measured[0]
        return slow_reason(self.name, self.where, self.field, self.timeout_s, self.max_retries + 1, answered_s, took_s,
                           cheap="answered an empty request",
                           fix=", or lower spec.roles.reward.batchSize (a request carries a whole batch)")


class GRPCScorer(RemoteScorer):
    """Scores over gRPC (`kind: grpc`).

    Args:
        name: reward name (metric label, error prefix).
        target: `host:port` of an `omnirl scorer serve --protocol grpc` (or any Scorer service).
        timeout_s: deadline of one attempt, seconds.
        max_retries: retries of a transiently failed batch.
        field: the reward's path (`spec.reward[1]`) for messages naming its settings.
    """

    def __init__(self, name: str, target: str, *, timeout_s: float = 30.0, max_retries: int = 2,
                 field: str | None = None, media: MediaRequest | None = None) -> None:
        self.name, self.target, self.timeout_s, self.max_retries = name, target, timeout_s, max_retries
        self.where, self.field = target, field or f"spec.reward[{name}]"
        self._set_media(media)
        options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        self.channel = grpc.insecure_channel(target, options=options)
        self.stub = pb2_grpc.ScorerStub(self.channel)

    def _score_request(self, request: Any, sample_ids: list[str]) -> Outcome:
        """Send `request` with retries; one score or error per sample."""
        def attempt(timeout_s: float) -> Outcome:
            try:
                response = self.stub.Score(request, timeout=timeout_s)
            except grpc.RpcError as err:
                reason = f"gRPC {err.code().name}: {err.details()}"
                if err.code() in RETRY_GRPC_CODES:
                    raise Retryable(reason, timed_out=err.code() == grpc.StatusCode.DEADLINE_EXCEEDED) from err
                raise ScorerError("", f"{self.name}: {self.target} failed: {reason}") from err
            return read_response(self.name, self.target, response, sample_ids)

        return with_retries(attempt, self.timeout_s, self.max_retries, f"{self.name}: {self.target} unreachable",
                            self._slow_or_away)

    def _answers(self, timeout_s: float) -> bool:
        return probe_grpc(self.stub, timeout_s)[0] is not None

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()


class HTTPScorer(RemoteScorer):
    """Scores over the HTTP/JSON twin (`kind: http`): POST `ScoreRequest` JSON to `url`.

    Args:
        name: reward name (metric label, error prefix).
        url: the score endpoint, e.g. `http://ocr-scorer:8000/v1/score`.
        timeout_s: timeout of one attempt, seconds.
        max_retries: retries of a transiently failed batch.
        field: the reward's path (`spec.reward[1]`) for messages naming its settings.
    """

    def __init__(self, name: str, url: str, *, timeout_s: float = 30.0, max_retries: int = 2,
                 field: str | None = None, media: MediaRequest | None = None) -> None:
        self.name, self.url, self.timeout_s, self.max_retries = name, url, timeout_s, max_retries
        self.where, self.field = url, field or f"spec.reward[{name}]"
        self._set_media(media)

    def _score_request(self, message: Any, sample_ids: list[str]) -> Outcome:
        """POST `message` (a `ScoreRequest`) as JSON with retries; one score or error per sample."""
        body = json.dumps(to_json(message)).encode()
        request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})

        def attempt(timeout_s: float) -> Outcome:
            try:
                with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                    raw = resp.read()
            except urllib.error.HTTPError as err:
                reason = f"HTTP {err.code}: {err.read()[:300].decode(errors='replace')}"
                if err.code in RETRY_HTTP_STATUS:
                    raise Retryable(reason) from err
                raise ScorerError("", f"{self.name}: {self.url} failed: {reason}") from err
            except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
                cause = getattr(err, "reason", err)
                raise Retryable(str(cause), timed_out=isinstance(cause, TimeoutError)) from err
            try:
                response = from_json(json.loads(raw), pb2.ScoreResponse)
            except ValueError as err:  # json.JSONDecodeError is a ValueError
                raise ScorerError("", f"{self.name}: {self.url} returned a malformed body ({err}): "
                                      f"{raw[:300].decode(errors='replace')!r}") from err
            return read_response(self.name, self.url, response, sample_ids)

        return with_retries(attempt, self.timeout_s, self.max_retries, f"{self.name}: {self.url} unreachable",
                            self._slow_or_away)

    def _answers(self, timeout_s: float) -> bool:
        status = probe_http(self.url, timeout_s)[0]
        return status is not None and status < 500  # a 5xx: a proxy before a scorer that is away, or a broken one
