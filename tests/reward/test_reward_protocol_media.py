"""Video and audio over the scorer protocol: the media fields of `Sample` (sampled PNG frames, float32 PCM) round
trip exactly, and `omnirl scorer serve` processes of media kinds (gRPC and the HTTP/JSON twin) score what the same
scorer scores in-process, a sample without the asked-for audio failing alone; image scorers keep working."""

from __future__ import annotations

import numpy as np
import pytest
from tests.reward.test_protocol import serve

from omnirl.reward.audio_signal import AudioSignalScorer
from omnirl.reward.protocol.codec import build_media_request, from_json, pb2, sample_media, to_json
from omnirl.reward.remote import GRPCScorer, HTTPScorer, MediaRequest
from omnirl.reward.temporal import TemporalConsistencyScorer

RATE = 8000


def _media(seed: int, *, audio: bool = True) -> dict:
    rng = np.random.default_rng(seed)
    video = rng.integers(0, 256, (9, 8, 12, 3), dtype=np.uint8)
    video[::2] = 128  # half the frames flat: a temporal-consistency value far from 0 and 1
    media = {"video": video, "fps": np.float32(8.0)}
    if audio:
        t = np.arange(RATE) / RATE
        media.update(audio=(0.05 * (seed + 1) * np.sin(2 * np.pi * 220 * t)).astype(np.float32),
                     audio_sample_rate=np.int64(RATE))
    return media


def test_media_fields_round_trip_exactly_through_both_encodings():
    media = [_media(0), _media(1)]
    request = build_media_request(media, ["p", "q"], ["a", "b"], frame_stride=4, frame_count=None, audio=True)
    for message in (request, from_json(to_json(request), pb2.ScoreRequest)):  # gRPC bytes and the HTTP/JSON twin
        for sample, original in zip(message.samples, media, strict=True):
            got = sample_media(sample)
            assert list(got["frame_indices"]) == [0, 4, 8] and sample.frame_count == 9
            assert np.array_equal(got["video"], original["video"][[0, 4, 8]])
            assert np.array_equal(got["image"], original["video"][4])  # the poster: the middle frame
            assert got["audio"].dtype == np.float32 and np.array_equal(got["audio"], original["audio"])
            assert int(got["audio_sample_rate"]) == RATE and float(got["fps"]) == 8.0
    counted = build_media_request(media[:1], ["p"], ["a"], frame_stride=None, frame_count=3, audio=False)
    assert list(counted.samples[0].frame_indices) == [0, 4, 8] and not counted.samples[0].audio_f32le


@pytest.fixture(scope="module", params=["grpc", "http"])
def temporal(request):
    yield from ((request.param, port) for _, port in serve("--reward", "temporal-consistency",
                                                           "--protocol", request.param))


@pytest.fixture(scope="module", params=["grpc", "http"])
def loudness(request):
    yield from ((request.param, port) for _, port in serve("--reward", "audio-signal", "--param", "measure=loudness",
                                                           "--protocol", request.param))


def _client(protocol: str, port: int, media: MediaRequest):
    if protocol == "grpc":
        return GRPCScorer("remote", f"127.0.0.1:{port}", timeout_s=30, media=media)
    return HTTPScorer("remote", f"http://127.0.0.1:{port}/v1/score", timeout_s=30, media=media)


def test_a_served_video_scorer_scores_like_in_process(temporal):
    protocol, port = temporal
    media = [_media(0, audio=False), _media(1, audio=False)]
    client = _client(protocol, port, MediaRequest(frame_stride=1))
    assert client.modalities == {"video"}
    expected = TemporalConsistencyScorer().score_media(media, ["p", "q"], ["a", "b"])
    np.testing.assert_allclose(client.score_media(media, ["p", "q"], ["a", "b"]), expected, rtol=1e-6)
    # every 2nd frame sent: the server scores the frames it is sent (all flat here: 1.0)
    halves = _client(protocol, port, MediaRequest(frame_stride=2)).score_media(media[:1], ["p"], ["a"])
    assert halves.tolist() == [1.0]


def test_a_served_audio_scorer_scores_like_in_process_and_a_silent_sample_fails_alone(loudness):
    protocol, port = loudness
    media = [_media(0), _media(3), _media(1, audio=False)]
    client = _client(protocol, port, MediaRequest(audio=True))
    outcome = client.score_media_each(media, ["p"] * 3, ["a", "b", "c"])
    expected = AudioSignalScorer("loudness").score_media(media[:2], ["p"] * 2, ["a", "b"])
    np.testing.assert_allclose(outcome.values[:2], expected, rtol=1e-6)
    assert sorted(outcome.errors) == [2] and "no audio to send" in outcome.errors[2].reason
