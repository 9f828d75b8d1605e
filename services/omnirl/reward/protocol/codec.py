"""The scorer protocol's messages ↔ numpy, on both sides of the wire.

Client side: `build_request` (images → PNG samples) and `read_response` (results → `Outcome`).
Server side: `answer` scores a request with any scorer. The HTTP twin is the same messages in
proto3's JSON mapping (`to_json` / `from_json`: field names as in the .proto, bytes as base64).
No pickle: PNG bytes, strings and doubles only.
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np
from google.protobuf import json_format
from PIL import Image

from omnirl.reward.protocol.stubs import load
from omnirl.scorers.base import Outcome, Scorer, ScorerError, score_each

pb2, pb2_grpc = load()


def encode_png(image: np.ndarray) -> bytes:
    """PNG bytes of one `[H, W, 3]` uint8 RGB image (lossless)."""
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG", compress_level=1)  # speed over size: it is one hop
    return buf.getvalue()


def decode_png(data: bytes) -> np.ndarray:
    """`[H, W, 3]` uint8 RGB image of PNG (or any PIL-readable) bytes.

    Raises:
        ValueError: the bytes are not a readable image.
    """
    try:
        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(im.convert("RGB"), dtype=np.uint8)
    except (OSError, ValueError, Image.DecompressionBombError) as err:
        raise ValueError(f"image_png is not a readable image ({len(data)} bytes): {err}") from err


def build_request(images: np.ndarray, prompts: list[str], sample_ids: list[str]) -> Any:
    """A `ScoreRequest` of `[B, H, W, 3]` uint8 images with their prompts and sample ids."""
    return pb2.ScoreRequest(samples=[
        pb2.Sample(sample_id=sid, prompt=prompt, image_png=encode_png(image))
        for image, prompt, sid in zip(images, prompts, sample_ids, strict=True)
    ])


def read_response(name: str, where: str, response: Any, sample_ids: list[str]) -> Outcome:
    """The `Outcome` of a `ScoreResponse` for the request's `sample_ids`.

    A sample with `error`, or a non-finite score, is a failed sample with the server's reason.

    Raises:
        ScorerError: (sample id "") the response does not answer exactly the request's samples in order.
    """
    got = [r.sample_id for r in response.results]
    if got != list(sample_ids):
        raise ScorerError("", f"{name}: {where} answered samples {got[:4]}... ({len(got)}) for a request of "
                              f"{list(sample_ids)[:4]}... ({len(sample_ids)}); it must answer each sample once, in order")
    outcome = Outcome(np.zeros(len(sample_ids), dtype=np.float32))
    for i, result in enumerate(response.results):
        which = result.WhichOneof("outcome")
        if which == "score" and math.isfinite(result.score):
            outcome.values[i] = result.score
        elif which == "score":
            outcome.errors[i] = ScorerError(result.sample_id, f"{name}: {where} returned score {result.score} (not finite)")
        elif which == "error":
            outcome.errors[i] = ScorerError(result.sample_id, f"{name}: {result.error}")
        else:
            outcome.errors[i] = ScorerError(result.sample_id, f"{name}: {where} returned neither score nor error")
    return outcome


def check_request(request: Any) -> list[str]:
    """The sample ids of a `ScoreRequest` that can be scored.

    Raises:
        ValueError: the request has no samples (a client's probe: `reward/remote.py`) or repeats a sample id.
    """
    ids = [s.sample_id for s in request.samples]
    if not ids:
        raise ValueError("the request has no samples")
    if len(set(ids)) != len(ids):
        raise ValueError("sample ids must be unique within a request")
    return ids


def answer(scorer: Scorer, request: Any) -> Any:
    """Score a `ScoreRequest` with `scorer` → `ScoreResponse` (one result per sample, in order).

    Images of different sizes are scored as separate batches; an undecodable image fails alone.

    Raises:
        ValueError: the request has no samples or repeats a sample id (`check_request`).
    """
    ids = check_request(request)
    errors: dict[int, str] = {}
    scores: dict[int, float] = {}
    by_shape: dict[tuple, list[tuple[int, np.ndarray]]] = {}
    for i, sample in enumerate(request.samples):
        try:
            image = decode_png(sample.image_png)
        except ValueError as err:
            errors[i] = str(err)
            continue
        by_shape.setdefault(image.shape, []).append((i, image))
    for group in by_shape.values():
        idx = [i for i, _ in group]
        outcome = score_each(scorer, np.stack([im for _, im in group]), [request.samples[i].prompt for i in idx],
                             [ids[i] for i in idx])
        for k, i in enumerate(idx):
            if k in outcome.errors:
                errors[i] = outcome.errors[k].reason
            else:
                scores[i] = float(outcome.values[k])
    results = [pb2.Result(sample_id=sid, error=errors[i]) if i in errors else pb2.Result(sample_id=sid, score=scores[i])
               for i, sid in enumerate(ids)]
    return pb2.ScoreResponse(results=results, scorer=scorer.name)


def to_json(message: Any) -> dict:
    """A protocol message as its proto3 JSON mapping (field names as in the .proto, bytes base64)."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def from_json(data: Any, message_type: Any) -> Any:
    """Parse the proto3 JSON mapping of `message_type` (unknown fields are errors).

    Raises:
        ValueError: `data` is not a valid JSON form of the message.
    """
    try:
        return json_format.ParseDict(data, message_type())
    except (json_format.ParseError, TypeError, AttributeError) as err:
        raise ValueError(f"not a valid {message_type.DESCRIPTOR.name}: {err}") from err
