"""Rewards of video and audio on hand-made media with known answers: flow_grpo's video OCR rule, an image scorer
over sampled frames, temporal consistency, the weightless audio measures, and CLAP (a tiny random CLAP saved
locally; the answer is the cosine computed by hand from the same model)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from omnirl.models.digits.render import render_text, slots_for
from omnirl.reward.audio_signal import AudioSignalScorer, rms_dbfs
from omnirl.reward.frames import FrameSampledScorer, frame_indices
from omnirl.reward.jpeg import JPEGCompressibilityScorer
from omnirl.reward.temporal import TemporalConsistencyScorer
from omnirl.reward.video_ocr import VideoOCRScorer, frame_reward, video_reward
from omnirl.scorers.base import ScorerError

RATE = 8000


def _video(frames: list[np.ndarray]) -> dict:
    return {"video": np.stack(frames).astype(np.uint8), "fps": np.float32(8.0)}


def _audio(wave: np.ndarray, rate: int = RATE) -> dict:
    return {"audio": wave.astype(np.float32), "audio_sample_rate": np.int64(rate)}


def _text_frame(text: str, seed: int = 0) -> np.ndarray:
    gray = render_text(text, slots_for(text), np.random.default_rng(seed))
    return np.repeat(gray[..., None], 3, axis=-1)


def test_frame_indices():
    assert frame_indices(33, stride=4) == [0, 4, 8, 12, 16, 20, 24, 28, 32]  # flow_grpo's video[::4]
    assert frame_indices(9, count=3) == [0, 4, 8]
    assert frame_indices(4, count=8) == [0, 1, 2, 3] and frame_indices(5, count=1) == [0]
    with pytest.raises(ValueError, match="exactly one of stride"):
        frame_indices(9, stride=2, count=2)


@pytest.mark.parametrize("reading, expected", [("123", 1.0), ("12", 2 / 3), ("x123", 2 / 3), ("", 0.0), ("9999", 0.0)])
def test_video_ocr_frame_rule_is_flow_grpos(reading, expected):
    # no "target inside the reading" shortcut in flow_grpo's video rule: "x123" is one edit away
    assert frame_reward("123", reading) == pytest.approx(expected)


def test_video_reward_averages_the_frames_that_read_something():
    assert video_reward([1.0, 0.0, 0.5]) == pytest.approx(0.75) and video_reward([0.0, 0.0]) == 0.0


def test_video_ocr_reads_every_fourth_frame():
    """Frames 0, 4, 8 of 9 are read: "123", "12" drawn and a blank page score 1 and 2/3 and nothing (left out of the
    mean), so 5/6; the frames between them (never read) hold other numbers."""
    scorer = VideoOCRScorer(alphabet="0123456789")
    blank = np.full_like(_text_frame("123"), 255)
    other = _text_frame("987")
    video = [_text_frame("123"), other, other, other, _text_frame("12").repeat(1, 0)[:, :64], other, other, other,
             blank]
    width = min(f.shape[1] for f in video)
    video = [f[:, :width] for f in video]
    assert scorer.readings(np.stack(video)) == ["123", "12", ""]
    rewards = scorer.score_media([_video(video), _video([blank] * 9)], ['A sign that says "123"'] * 2, ["a", "b"])
    assert rewards.dtype == np.float32 and rewards.tolist() == pytest.approx([(1 + 2 / 3) / 2, 0.0])
    with pytest.raises(ScorerError, match="lacks \\['video'\\]"):
        scorer.score_media([_audio(np.zeros(8))], ['"1"'], ["c"])


def test_an_image_scorer_over_sampled_frames_is_the_mean_of_its_frame_scores():
    jpeg = JPEGCompressibilityScorer(quality=90)
    rng = np.random.default_rng(0)
    flat, noisy = np.full((16, 16, 3), 128, np.uint8), rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
    frames = [flat, noisy, flat, noisy, flat]  # stride 2 reads only the flat ones
    scorer = FrameSampledScorer(jpeg, stride=2)
    reward = scorer.score_media([_video(frames)], ["p"], ["s"])[0]
    assert reward == pytest.approx(jpeg.score(flat[None], ["p"], ["x"])[0])
    both = FrameSampledScorer(jpeg, count=2).score_media([_video(frames[:2])], ["p"], ["s"])[0]
    assert both == pytest.approx(jpeg.score(np.stack([flat, noisy]), ["p"] * 2, ["x", "y"]).mean(), rel=1e-6)
    assert scorer.name == "jpeg_compressibility@frames" and scorer.modalities == {"video"}


def test_temporal_consistency_known_values():
    black, white = np.zeros((4, 4, 3), np.uint8), np.full((4, 4, 3), 255, np.uint8)
    ramp = [np.full((4, 4, 3), 51 * k, np.uint8) for k in range(5)]  # each step 51/255 = 0.2
    rewards = TemporalConsistencyScorer().score_media(
        [_video([black] * 3), _video([black, white, black]), _video(ramp), _video([white])], ["p"] * 4, list("abcd"))
    assert rewards.tolist() == pytest.approx([1.0, 0.0, 0.8, 1.0])


def test_audio_loudness_clipping_and_silence_known_values():
    t = np.arange(RATE) / RATE
    sine = lambda amp: amp * np.sin(2 * np.pi * 200 * t)  # noqa: E731 - 200 Hz, a whole number of periods
    # RMS of a sine is amp/√2: amp = √2·10^(−20/20) is −20 dBFS (inside [−30, −10]); amp·10^(−20/20) is −40 dBFS,
    # 10 dB below the range: 1 − 10/20
    assert rms_dbfs(sine(math.sqrt(2) * 0.1)) == pytest.approx(-20.0, abs=1e-6)
    loud = AudioSignalScorer("loudness")
    media = [_audio(sine(math.sqrt(2) * 0.1)), _audio(sine(math.sqrt(2) * 0.01)), _audio(np.zeros(RATE))]
    assert loud.score_media(media, ["p"] * 3, list("abc")).tolist() == pytest.approx([1.0, 0.5, 0.0])
    square = np.sign(sine(1.0)) * np.where(np.arange(RATE) % 4 == 0, 1.0, 0.5)  # 1 sample in 4 at full scale
    assert AudioSignalScorer("clipping").score_media([_audio(square)], ["p"], ["a"])[0] == pytest.approx(0.75, abs=1e-3)
    half = np.concatenate([np.zeros(RATE // 2), sine(0.5)[: RATE // 2]])  # 25 silent 20-ms frames of 50
    assert AudioSignalScorer("silence").score_media([_audio(half)], ["p"], ["a"])[0] == pytest.approx(0.5)
    with pytest.raises(ScorerError, match="NaN or inf"):
        loud.score_media([_audio(np.array([np.nan, 0.0]))], ["p"], ["a"])
    with pytest.raises(ValueError, match="measure must be one of"):
        AudioSignalScorer("pitch")


# ---------------------------------------------------------------- CLAP


def save_tiny_clap(path) -> None:
    """A tiny random `ClapModel` and `ClapProcessor` (8 kHz, 16 mel bins, 1 s), saved with `save_pretrained`."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import ClapConfig, ClapFeatureExtractor, ClapModel, ClapProcessor, RobertaTokenizerFast

    torch.manual_seed(0)
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 4}
    for ch in "abcdefghijklmnopqrstuvwxyz0123456789\"' ":
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tokenizer = RobertaTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                     unk_token="<unk>", mask_token="<mask>", model_max_length=32)
    extractor = ClapFeatureExtractor(feature_size=16, sampling_rate=RATE, hop_length=80, max_length_s=1,
                                     fft_window_size=128, truncation="rand_trunc", padding="repeatpad")
    config = ClapConfig(
        text_config={"vocab_size": len(vocab), "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                     "intermediate_size": 16, "max_position_embeddings": 40, "projection_dim": 8},
        audio_config={"window_size": 2, "num_mel_bins": 16, "spec_size": 64, "patch_size": 4, "patch_stride": [4, 4],
                      "num_classes": 4, "hidden_size": 16, "projection_dim": 8, "depths": [1, 1],
                      "num_attention_heads": [2, 2], "enable_fusion": False, "patch_embeds_hidden_size": 8},
        projection_dim=8)
    ClapModel(config).eval().save_pretrained(path)
    ClapProcessor(feature_extractor=extractor, tokenizer=tokenizer).save_pretrained(path)


@pytest.fixture(scope="module")
def clap(tmp_path_factory):
    pytest.importorskip("transformers")
    from omnirl.reward.clap import ClapScorer

    path = tmp_path_factory.mktemp("clap")
    save_tiny_clap(path)
    return path, ClapScorer(path)


def test_resample_keeps_a_tone():
    from omnirl.reward.clap import resample

    t16, t8 = np.arange(16000) / 16000, np.arange(8000) / 8000
    tone = lambda t: np.sin(2 * np.pi * 440 * t).astype(np.float32)  # noqa: E731
    np.testing.assert_allclose(resample(tone(t16), 16000, 8000), tone(t8), atol=1e-4)
    np.testing.assert_allclose(resample(tone(t8), 8000, 16000), tone(t16), atol=1e-4)


def test_clap_reward_is_the_cosine_of_the_models_embeddings(clap):
    import torch
    from transformers import ClapModel, ClapProcessor

    path, scorer = clap
    t = np.arange(RATE) / RATE
    beep = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    hum = (0.3 * np.sin(2 * np.pi * 60 * t)).astype(np.float32)
    prompts = ['a "beep"', "a low hum"]
    rewards = scorer.score_media([_audio(beep), _audio(hum)], prompts, ["a", "b"])
    model, processor = ClapModel.from_pretrained(path), ClapProcessor.from_pretrained(path)
    with torch.no_grad():
        inputs = processor(text=prompts, audio=[beep, hum], sampling_rate=RATE, return_tensors="pt", padding=True)
        a = model.get_audio_features(input_features=inputs["input_features"], is_longer=inputs["is_longer"])
        x = model.get_text_features(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    a, x = (getattr(o, "pooler_output", o) for o in (a, x))
    expected = torch.nn.functional.cosine_similarity(a, x, dim=-1).numpy()
    np.testing.assert_allclose(rewards, expected, atol=1e-5)
    assert np.all(np.abs(rewards) <= 1) and scorer.modalities == {"audio"}
    # a clip at another rate is resampled to the extractor's 8 kHz first: the same tone at 16 kHz scores the same
    t16 = np.arange(16000) / 16000
    beep16 = (0.5 * np.sin(2 * np.pi * 440 * t16)).astype(np.float32)
    again = scorer.score_media([_audio(beep16, 16000)], prompts[:1], ["c"])
    assert again[0] == pytest.approx(rewards[0], abs=1e-3)


def test_clap_needs_a_local_directory(tmp_path):
    from omnirl.reward.clap import ClapScorer

    with pytest.raises(FileNotFoundError, match="needs a local directory holding ClapModel"):
        ClapScorer(tmp_path / "nowhere")


def test_the_contact_sheet_strip_of_a_clip_shorter_than_one_hop_is_one_bar():
    """A tiny model's 132 samples at 16 kHz (less than one 10-ms hop) draw one bar of its RMS, not a crash."""
    from omnirl.controller.media_files import STRIP_HEIGHT, loudness_strip

    strip = loudness_strip(np.full(132, 0.25, np.float32), 16000, 20)
    # RMS over the padded hop = 0.25·sqrt(132/160); full height is RMS 0.5
    height = round(STRIP_HEIGHT * 0.25 * math.sqrt(132 / 160) / 0.5)
    assert strip.shape == (STRIP_HEIGHT, 20, 3) and (strip[:, :, 0] == 40).sum(axis=0).tolist() == [height] * 20
