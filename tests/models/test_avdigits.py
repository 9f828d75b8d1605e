"""The built-in audio+video digits task (docs/omni.md): its latent and decoder, its four rewards on hand-made
media with known answers, and its adapter's flat latent (the audio/video split)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnirl.models.avdigits.adapter import AVDigitsAdapter, save_avdigits_checkpoint, tokenize_prompt
from omnirl.models.avdigits.media import (
    AUDIO_SHAPE,
    CELL_SAMPLES,
    FRAMES,
    SAMPLE_RATE,
    VIDEO_SHAPE,
    Sign,
    decode_media,
    render_sign,
    sign_latents,
)
from omnirl.models.avdigits.model import AVDigitsConfig, AVDigitsDiT
from omnirl.models.avdigits.prompts import make_prompt, prompt_sets
from omnirl.reward.avdigits import (
    BeepCountScorer,
    FrameOCRScorer,
    PitchScorer,
    SyncScorer,
    count_beeps,
    dominant_hz,
    inked_frames,
    sound_runs,
)

FRAME_SAMPLES = SAMPLE_RATE // FRAMES


def _media(sign: Sign) -> dict[str, np.ndarray]:
    video, audio = sign_latents(sign, render_sign(sign.number))
    batched = decode_media(torch.from_numpy(video)[None], torch.from_numpy(audio)[None])
    return {k: v[0].numpy() for k, v in batched.items()}


def _tone(hz: float, start_s: float, stop_s: float, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (0.5 * np.sin(2 * np.pi * hz * t) * ((t >= start_s) & (t < stop_s))).astype(np.float32)


@pytest.fixture(scope="module")
def ocr() -> FrameOCRScorer:
    return FrameOCRScorer()


def _scores(ocr: FrameOCRScorer, media: list[dict], prompts: list[str]) -> dict[str, np.ndarray]:
    ids = [f"0:0:{i}" for i in range(len(media))]
    scorers = {"ocr": ocr, "beeps": BeepCountScorer(), "pitch": PitchScorer(), "sync": SyncScorer()}
    return {name: s.score_media(media, prompts, ids) for name, s in scorers.items()}


def test_a_right_sample_scores_1_on_every_term(ocr: FrameOCRScorer) -> None:
    signs = [Sign("42", 2, 3), Sign("9071", 4, 0), Sign("13", 1, 7), Sign("508", 3, 2)]
    scores = _scores(ocr, [_media(s) for s in signs], [make_prompt(s.number, s.beeps) for s in signs])
    for name, values in scores.items():
        np.testing.assert_allclose(values, 1.0, err_msg=name)


def test_the_decoded_sample_has_ink_and_beeps_on_its_frames_at_its_pitch() -> None:
    media = _media(Sign("704", 3, 2))
    assert media["video"].shape == (8, 32, 64, 3) and media["video"].dtype == np.uint8
    assert inked_frames(media["video"]).tolist() == [False, False, True, True, True, False, False, False]
    runs = sound_runs(media["audio"], SAMPLE_RATE)
    assert len(runs) == 3 and count_beeps(runs) == 3
    assert [round(a * 8 + 1 / 4) for a, _ in runs] == [2, 3, 4]  # each beep starts with its frame
    assert dominant_hz(media["audio"], SAMPLE_RATE, runs) == pytest.approx(300 + 100 * 7, abs=2)
    assert media["audio_sample_rate"] == SAMPLE_RATE and media["fps"] == 8.0


def test_ink_on_every_frame_and_a_beep_all_the_time_scores_low(ocr: FrameOCRScorer) -> None:
    sign = Sign("42", 2, 0)
    media = _media(sign)
    media["video"] = np.repeat(media["video"][:1], FRAMES, axis=0)  # the sign on every frame
    media["audio"] = _tone(300 + 100 * 4, 0.0, 1.0)  # the right pitch, held the whole second
    scores = _scores(ocr, [media], [make_prompt("42", 2)])
    assert scores["ocr"][0] == pytest.approx(2 / 8)  # legible, but on 8 frames for 2 beeps
    assert scores["beeps"][0] == pytest.approx(2.0 ** -14)  # a 1 s tone is 16 beeps' worth
    assert scores["pitch"][0] == pytest.approx(1.0)
    assert scores["sync"][0] == pytest.approx(1 / 8)  # one onset, ink on 8 frames
    total = sum(0.25 * float(v[0]) for v in scores.values())
    assert total < 0.35  # a right sample scores 1


def test_the_audio_shifted_by_one_frame_lowers_sync_only() -> None:
    signs = [Sign("42", 2, 3), Sign("9071", 4, 1)]
    media = [_media(s) for s in signs]
    prompts = [make_prompt(s.number, s.beeps) for s in signs]
    shifted = [dict(m, audio=np.roll(m["audio"], FRAME_SAMPLES)) for m in media]
    ids = ["a", "b"]
    np.testing.assert_allclose(SyncScorer().score_media(shifted, prompts, ids), [1 / 3, 3 / 5], rtol=1e-6)
    np.testing.assert_allclose(BeepCountScorer().score_media(shifted, prompts, ids), 1.0)
    np.testing.assert_allclose(PitchScorer().score_media(shifted, prompts, ids), 1.0)


def test_each_term_on_hand_made_media_with_a_known_answer(ocr: FrameOCRScorer) -> None:
    base = _media(Sign("61", 2, 4))
    prompt = make_prompt("61", 2)
    three = dict(base, audio=_tone(900, 0.5, 0.5625) + _tone(900, 0.625, 0.6875) + _tone(900, 0.75, 0.8125))
    assert BeepCountScorer().score_media([three], [prompt], ["x"])[0] == pytest.approx(0.5)  # 3 for 2
    wrong_pitch = dict(base, audio=_tone(950, 0.5, 0.5625) + _tone(950, 0.625, 0.6875))
    assert PitchScorer().score_media([wrong_pitch], [prompt], ["x"])[0] == pytest.approx(np.exp(-0.5), abs=2e-3)
    silent = dict(base, audio=np.zeros(8000, np.float32))
    assert PitchScorer().score_media([silent], [prompt], ["x"])[0] == 0.0
    assert SyncScorer().score_media([silent], [prompt], ["x"])[0] == 0.0  # ink, no beep: nothing in sync
    blank = dict(base, video=np.full_like(base["video"], 255))
    assert ocr.score_media([blank], [prompt], ["x"])[0] == 0.0
    other_number = _media(Sign("67", 2, 4))
    assert ocr.score_media([other_number], [prompt], ["x"])[0] == pytest.approx(0.5)  # one digit of two wrong
    one_frame = dict(base, video=np.where(np.arange(8)[:, None, None, None] == 4, base["video"], 255).astype(np.uint8))
    assert ocr.score_media([one_frame], [prompt], ["x"])[0] == pytest.approx(0.5)  # 1 inked frame for 2


def test_the_scorers_name_what_they_lack() -> None:
    from omnirl.scorers.base import ScorerError

    with pytest.raises(ScorerError, match="lacks"):
        SyncScorer().score_media([{"image": np.zeros((4, 4, 3), np.uint8)}], [make_prompt("12", 1)], ["s"])
    with pytest.raises(ScorerError, match="how many beeps"):
        BeepCountScorer().score_media([_media(Sign("12", 1, 0))], ['A sign that says "12"'], ["s"])


def test_prompts_tokenize_and_the_pool_and_held_out_sets_are_disjoint() -> None:
    assert tokenize_prompt('A sign that says "407" with 1 beep') == [5, 1, 8, 0, 1]
    with pytest.raises(ValueError, match="2–4 digits"):
        tokenize_prompt('A sign that says "12345" with 2 beeps')
    pool, heldout = prompt_sets(0)
    number = lambda p: p.split('"')[1]  # noqa: E731
    assert len(pool) == 1024 and len(heldout) == 128
    assert not {number(p) for p in pool} & {number(p) for p in heldout}


def _adapter(tmp_path, **modalities) -> AVDigitsAdapter:
    torch.manual_seed(0)
    from omnirl.models.avdigits.adapter import load_avdigits_adapter

    save_avdigits_checkpoint(AVDigitsDiT(AVDigitsConfig(d_model=32, depth=1, heads=2)), tmp_path)
    return load_avdigits_adapter(tmp_path, modalities=modalities or None)


def test_the_adapters_flat_latent_is_video_then_audio(tmp_path) -> None:
    """The split index is the video's size: a latent made of a sign's video and audio decodes to that sign.
    Swapping the split (audio first) or moving it by one element fails here."""
    adapter = _adapter(tmp_path)
    layout = adapter.latent_layout()
    v, a = int(np.prod(VIDEO_SHAPE)), int(np.prod(AUDIO_SHAPE))
    assert layout.segments == [("video", 0, v), ("audio", v, v + a)]
    assert adapter.latent_shape(tokenize_prompt(make_prompt("42", 2))) == (v + a,)
    sign = Sign("42", 2, 5)
    video, audio = sign_latents(sign, render_sign(sign.number))
    x0 = torch.from_numpy(np.concatenate([video.reshape(-1), audio.reshape(-1)]))[None]
    media = {k: t[0].numpy() for k, t in adapter.decode_media(x0).items()}
    assert inked_frames(media["video"]).tolist() == [f in sign.frames for f in range(FRAMES)]
    assert count_beeps(sound_runs(media["audio"], SAMPLE_RATE)) == 2
    # every audio cell's samples come from that cell alone: the first cell of frame 5 is the first beep
    first = sound_runs(media["audio"], SAMPLE_RATE)[0][0]
    assert abs(first * SAMPLE_RATE - 2 * 5 * CELL_SAMPLES) <= 80


def test_velocity_guides_each_modality_by_its_own_scale(tmp_path) -> None:
    """CFG per modality: the audio's guided velocity is u + g_a·(c − u), the video's with g_v (neither left at
    the conditional one). Guidance applied to one modality only fails here."""
    adapter = _adapter(tmp_path, video={"guidance_scale": 3.0}, audio={"guidance_scale": 2.0})
    for p in adapter.module.parameters():  # the zero-initialised output heads would make c = u
        torch.nn.init.normal_(p, std=0.05)
    ids = adapter.encode([tokenize_prompt(make_prompt("42", 2))])
    x, sigma = torch.randn(1, adapter.latent_layout().numel), torch.tensor([0.6])
    with torch.no_grad():
        out = adapter.velocity(x, sigma, ids)
        cond = adapter.module(x, sigma, ids["prompt_ids"])
        uncond = adapter.module(x, sigma, torch.zeros_like(ids["prompt_ids"]))
    v = int(np.prod(VIDEO_SHAPE))
    assert not torch.allclose(cond, uncond)
    torch.testing.assert_close(out[:, :v], uncond[:, :v] + 3.0 * (cond[:, :v] - uncond[:, :v]))
    torch.testing.assert_close(out[:, v:], uncond[:, v:] + 2.0 * (cond[:, v:] - uncond[:, v:]))


def test_pretrain_is_deterministic_and_saves_a_loadable_checkpoint(tmp_path) -> None:
    from omnirl.models.avdigits.adapter import load_avdigits_adapter
    from omnirl.models.avdigits.pretrain import pretrain

    config = AVDigitsConfig(d_model=32, depth=1, heads=2)
    a = pretrain(tmp_path / "a", steps=3, batch_size=4, config=config, log_every=0)
    pretrain(tmp_path / "b", steps=3, batch_size=4, config=config, log_every=0)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert a.steps == 3 and a.num_parameters == sum(p.numel() for p in AVDigitsDiT(config).parameters())
    adapter = load_avdigits_adapter(tmp_path / "a")
    assert adapter.provenance["steps"] == 3 and "omnirl pretrain --family av-digits" in adapter.provenance["command"]


def test_the_shipped_weights_are_the_ones_their_provenance_names() -> None:
    """PROVENANCE.md records how the shipped weights were made and their sha256: new weights need a new record."""
    import hashlib
    import json
    import re

    from omnirl.models.avdigits.adapter import BUILTIN_DIR

    text = (BUILTIN_DIR.parent / "PROVENANCE.md").read_text()
    recorded = re.search(r"`weights/model\.safetensors`, sha256\s+`([0-9a-f]{64})`", text)
    assert recorded, "PROVENANCE.md must give the shipped weights' sha256"
    assert hashlib.sha256((BUILTIN_DIR / "model.safetensors").read_bytes()).hexdigest() == recorded.group(1)
    provenance = json.loads((BUILTIN_DIR / "config.json").read_text())["provenance"]
    assert (provenance["seed"], provenance["steps"], provenance["args"]["batch_size"]) == (0, 400, 32)
    assert "| seed, batch, steps | 0, 32, 550 | 0, 32, 400 |" in text
