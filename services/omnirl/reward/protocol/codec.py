"""The scorer protocol's messages ↔ numpy, on both sides of the wire.

Client side: `build_request` (images → PNG samples), `build_media_request` (videos and sounds → sampled PNG frames,
float32 PCM and their rates, the poster frame as `image_png`) and `read_response` (results → `Outcome`).
Server side: `answer` scores a request with any scorer: an image scorer reads `image_png`, a media scorer
(`base.reads_media`) each sample's media rebuilt from its frames and sound (`sample_media`). The HTTP twin is the
same messages in proto3's JSON mapping (`to_json` / `from_json`: field names as in the .proto, bytes as base64).
No pickle: PNG bytes, raw float32 samples, strings and numbers only.
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np
from google.protobuf import json_format
from PIL import Image

from omnirl.reward.frames import frame_indices
from omnirl.reward.protocol.stubs import load
from omnirl.scorers.base import Outcome, Scorer, ScorerError, reads_media, score_each, score_media_each

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


def build_media_request(media: list[dict], prompts: list[str], sample_ids: list[str], *, frame_stride: int | None,
                        frame_count: int | None, audio: bool) -> Any:
    """A `ScoreRequest` of B samples' media (dicts of numpy arrays, the multi-modal contract): the frames picked by
    `frame_stride` / `frame_count` (`frames.frame_indices`; neither: no video sent) as PNGs with their indices, the
    clip's frame count and fps, the middle frame as `image_png`, and with `audio` the waveform as float32 PCM with
    its rate.

    Raises:
        ScorerError: a sample lacks the video or the audio the request is to carry (naming it).
    """
    samples = []
    for m, prompt, sid in zip(media, prompts, sample_ids, strict=True):
        fields: dict = {"sample_id": sid, "prompt": prompt}
        if frame_stride is not None or frame_count is not None:
            if "video" not in m:
                raise ScorerError(sid, f"its media has no video to send (has {sorted(m)})")
            video = np.asarray(m["video"])
            picked = frame_indices(video.shape[0], stride=frame_stride, count=frame_count)
            fields.update(frames_png=[encode_png(video[k]) for k in picked], frame_indices=picked,
                          frame_count=video.shape[0], fps=float(np.asarray(m.get("fps", 0.0))),
                          image_png=encode_png(video[video.shape[0] // 2]))
        elif "image" in m:
            fields["image_png"] = encode_png(np.asarray(m["image"]))
        if audio:
            if "audio" not in m:
                raise ScorerError(sid, f"its media has no audio to send (has {sorted(m)})")
            fields.update(audio_f32le=np.asarray(m["audio"], dtype="<f4").tobytes(),
                          audio_sample_rate=int(np.asarray(m["audio_sample_rate"])))
        samples.append(pb2.Sample(**fields))
    return pb2.ScoreRequest(samples=samples)


def sample_media(sample: Any) -> dict[str, np.ndarray]:
    """One `Sample`'s media as numpy (the multi-modal contract): `video` uint8 `[n, H, W, 3]` of its sent frames,
    `fps`, `frame_indices` int64 `[n]`; `audio` float32 `[L]` and `audio_sample_rate`; `image` from `image_png`.

    Raises:
        ValueError: an undecodable frame or image, frames of different sizes, or audio bytes that are not whole
            float32 samples or lack a sample rate.
    """
    media: dict[str, np.ndarray] = {}
    if sample.frames_png:
        frames = [decode_png(f) for f in sample.frames_png]
        if len({f.shape for f in frames}) != 1:
            raise ValueError(f"frames_png holds frames of different sizes {sorted({f.shape for f in frames})}")
        media.update(video=np.stack(frames), fps=np.float32(sample.fps),
                     frame_indices=np.asarray(sample.frame_indices or range(len(frames)), dtype=np.int64))
    if sample.audio_f32le:
        if len(sample.audio_f32le) % 4 or sample.audio_sample_rate < 1:
            raise ValueError(f"audio_f32le must be whole float32 samples ({len(sample.audio_f32le)} bytes) with "
                             f"audio_sample_rate > 0 ({sample.audio_sample_rate})")
        media.update(audio=np.frombuffer(sample.audio_f32le, dtype="<f4").astype(np.float32),
                     audio_sample_rate=np.int64(sample.audio_sample_rate))
    if sample.image_png:
        media["image"] = decode_png(sample.image_png)
    return media


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
    if reads_media(scorer):  # a video / audio scorer: each sample's media, rebuilt from its frames and sound
        return _answer_media(scorer, request, ids)
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
        _collect(outcome, idx, scores, errors)
    return _response(scorer, ids, scores, errors)


def _answer_media(scorer: Any, request: Any, ids: list[str]) -> Any:
    """`answer` for a media scorer: one `score_media` call over the samples whose media decode."""
    errors: dict[int, str] = {}
    scores: dict[int, float] = {}
    decoded: dict[int, dict] = {}
    for i, sample in enumerate(request.samples):
        try:
            decoded[i] = sample_media(sample)
        except ValueError as err:
            errors[i] = str(err)
    idx = sorted(decoded)
    if idx:
        outcome = score_media_each(scorer, [decoded[i] for i in idx], [request.samples[i].prompt for i in idx],
                                   [ids[i] for i in idx])
        _collect(outcome, idx, scores, errors)
    return _response(scorer, ids, scores, errors)


def _collect(outcome: Any, idx: list[int], scores: dict[int, float], errors: dict[int, str]) -> None:
    """File the `Outcome` of the request's samples `idx` (in that order) under their indices: a score, or its
    ScorerError's reason."""
    for k, i in enumerate(idx):
        if k in outcome.errors:
            errors[i] = outcome.errors[k].reason
        else:
            scores[i] = float(outcome.values[k])


def _response(scorer: Any, ids: list[str], scores: dict[int, float], errors: dict[int, str]) -> Any:
    """The `ScoreResponse`: one `Result` per sample id, in the request's order, its error or its score."""
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
