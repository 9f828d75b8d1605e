"""The VLM judge on video and sound (a real OpenAI-compatible judge process, `tests/judge_server.py`): a video
sample's evenly spaced frames go as images after a line saying so, its sound as a base64 WAV `input_audio` part,
the default question asks about the video / sound, and the judge's answers (read from the first frame's pixels,
or heard as the sound's peak) are the known rewards."""

from __future__ import annotations

import numpy as np
import pytest
from tests.reward.test_vlm import image, judge, stats, vlm  # noqa: F401 - `judge` is the module's server fixture

from omnirl.reward.vlm import wav_bytes

RATE = 8000


def _video(first: str, frames: int = 9) -> np.ndarray:
    return np.stack([image(first, seed=k) for k in range(frames)])


def test_frames_go_as_images_and_are_scored_from_the_first(judge):  # noqa: F811
    scorer = vlm(judge, template="read-text", frames=3)
    assert scorer.modalities == {"video"}
    media = [{"video": _video('2048'), "fps": np.float32(8.0)}, {"video": _video('2047'), "fps": np.float32(8.0)}]
    rewards = scorer.score_media(media, ['A sign that says "2048"'] * 2, ["v0", "v1"])
    assert rewards.tolist() == pytest.approx([1.0, 0.75])  # the OCR rule on what the judge "read" in frame 0
    sent = stats(judge, "judge")[-2:]
    assert [r["images"] for r in sent] == [3, 3] and all(r["audio_formats"] == [] for r in sent)
    assert sent[0]["texts"][0] == "The 3 images are frames of one video, in order (9 frames at 8 fps)."
    assert "this video" in sent[0]["question"] and "this image" not in sent[0]["question"]


def test_sound_goes_as_a_wav_input_audio_part_and_a_sample_without_it_fails_alone(judge):  # noqa: F811
    scorer = vlm(judge, template="yes-no", audio=True)
    assert scorer.modalities == {"audio"}
    t = np.arange(RATE) / RATE
    media = [{"audio": (peak * np.sin(2 * np.pi * 200 * t)).astype(np.float32), "audio_sample_rate": np.int64(RATE)}
             for peak in (0.25, 0.5)] + [{"video": _video("1")}]
    outcome = scorer.score_media_each(media, ["a drum"] * 3, ["a0", "a1", "a2"])
    # the judge hears the peak p and answers yes with P(yes) = p, P(no) = 1 − p: the reward is p (16-bit PCM)
    assert outcome.values[:2].tolist() == pytest.approx([0.25, 0.5], abs=1e-3)
    assert sorted(outcome.errors) == [2] and "lacks ['audio']" in outcome.errors[2].reason
    sent = stats(judge, "judge")[-2:]
    assert [r["audio_formats"] for r in sent] == [["wav"], ["wav"]] and [r["images"] for r in sent] == [0, 0]
    assert "this sound" in sent[0]["question"]


def test_wav_bytes_is_16_bit_mono_pcm_of_the_waveform():
    import io
    import wave

    x = np.array([0.0, 0.5, -0.5, 1.0, -1.2], dtype=np.float32)
    with wave.open(io.BytesIO(wav_bytes(x, RATE))) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, RATE, 5)
        pcm = np.frombuffer(w.readframes(5), dtype="<i2")
    assert pcm.tolist() == [0, 16384, -16384, 32767, -32768]  # round(x·32767), clipped
