"""Tests of the OCR and JPEG scorers and the Flow-GRPO text-matching rule."""

from __future__ import annotations

import numpy as np
import pytest

from omnirl.models.digits.render import render_text, slots_for
from omnirl.reward import Scorer, ScorerError
from omnirl.reward.jpeg import JPEGCompressibilityScorer
from omnirl.reward.ocr import OCRScorer, ctc_greedy_decode, preprocess
from omnirl.scorers.base import score_each
from omnirl.scorers.text import levenshtein, ocr_reward


@pytest.fixture(scope="module")
def ocr() -> OCRScorer:
    return OCRScorer(threads=1)


def rgb(gray: np.ndarray) -> np.ndarray:
    return np.repeat(gray[..., None], 3, axis=-1)


@pytest.mark.parametrize(
    "reading, expected", [("2048", 1.0), ("x2048y", 1.0), ("2047", 0.75), ("", 0.0), ("20 48", 1.0), ("99999999", 0.0)]
)
def test_flow_grpo_reward_rule(reading, expected):
    assert ocr_reward("2048", reading) == pytest.approx(expected)


def test_levenshtein_hand_cases():
    assert levenshtein("kitten", "sitting") == 3
    assert levenshtein("", "abc") == 3
    assert levenshtein("2048", "2408") == 2


def test_ctc_decoding_merges_repeats_and_drops_blanks():
    class_ids = np.array([10, 20])  # alphabet "ab" at model classes 10 and 20
    probs = np.zeros((1, 6, 30), dtype=np.float32)
    for t, cls in enumerate([10, 10, 0, 10, 20, 25]):  # class 25 is masked (not in the alphabet)
        probs[0, t, cls] = 1.0
    probs[0, 5, 20] = 0.5
    assert ctc_greedy_decode(probs, class_ids, "ab") == ["aab"]


def test_preprocess_follows_rapidocr():
    image = np.full((1, 32, 128, 3), 255, dtype=np.uint8)
    batch = preprocess(image)
    assert batch.shape == (1, 3, 48, 320)
    assert np.all(batch[..., :192] == 1.0) and np.all(batch[..., 192:] == 0.0)


def test_clean_digits_score_high_and_noise_low(ocr):
    rng = np.random.default_rng(0)
    numbers = ["2048", "731", "96054", "1234", "580", "37291"]
    images = {n: rgb(render_text(n, slots_for(n), rng)) for n in numbers}
    scores = []
    for n in numbers:  # two widths: score each shape as its own batch
        scores.append(ocr.score(images[n][None], [f'A sign that says "{n}"'], [n])[0])
    assert np.mean(scores) >= 0.95
    rewards, texts = ocr.score_with_texts(images["2048"][None], ['A sign that says "2048"'], ["s0"])
    assert texts == ["2048"] and rewards.dtype == np.float32
    noise = rgb(np.random.default_rng(1).integers(0, 256, size=(2, 32, 128), dtype=np.uint8))
    assert ocr.score(noise, ['"12345"', '"67890"'], ["n0", "n1"]).max() < 0.2
    assert isinstance(ocr, Scorer)


def test_scorer_errors_carry_the_sample_id(ocr):
    good = np.full((2, 32, 64, 3), 255, dtype=np.uint8)
    with pytest.raises(ScorerError, match="dtype float32") as err:
        ocr.score(good.astype(np.float32), ['"12"', '"34"'], ["7:1:0", "7:1:1"])
    assert err.value.sample_id == "7:1:0" and "uint8" in err.value.reason
    with pytest.raises(ScorerError, match=r"\[B, H, W, 3\]"):
        ocr.score(good[..., 0], ['"12"', '"34"'], ["a", "b"])
    with pytest.raises(ScorerError, match="has one double quote; quote the target text on both sides") as err:
        ocr.score(good, ['"12"', 'A sign that says "34'], ["a", "b"])
    assert err.value.sample_id == "b"
    with pytest.raises(ScorerError, match="2 prompts but 1"):
        ocr.score(good, ['"12"', '"34"'], ["a"])


def test_ocr_rejects_unknown_alphabet():
    with pytest.raises(ValueError, match="does not know"):
        OCRScorer(alphabet="0123\x01")


def test_jpeg_flat_beats_noise():
    scorer = JPEGCompressibilityScorer()
    flat = np.full((1, 64, 64, 3), 200, dtype=np.uint8)
    noise = np.random.default_rng(0).integers(0, 256, size=(1, 64, 64, 3), dtype=np.uint8)
    rewards = scorer.score(np.concatenate([flat, noise]), ["", ""], ["f", "n"])
    assert rewards.dtype == np.float32 and rewards[0] > rewards[1] and rewards.max() < 0
    assert rewards[1] < -5.0  # 64×64×3 random bytes barely compress: > 5 kB
    with pytest.raises(ScorerError, match="images must be uint8"):
        scorer.score(flat.astype(np.int32), [""], ["f"])


class _FailsOn:
    """Scores 1.0, except sample `bad` (a ScorerError naming it) or the whole call (`down`)."""

    name = "fails-on"

    def __init__(self, bad: str = "", down: bool = False) -> None:
        self.bad, self.down, self.calls = bad, down, 0

    def score(self, images, prompts, sample_ids):
        self.calls += 1
        if self.down:
            raise ScorerError("", "endpoint down")
        if self.bad in sample_ids:
            raise ScorerError(self.bad, "cannot read")
        return np.ones(len(sample_ids), dtype=np.float32)


def test_score_each_isolates_a_bad_sample_and_fails_all_on_a_batch_error():
    images = np.zeros((3, 4, 4, 3), np.uint8)
    scorer = _FailsOn(bad="b")
    outcome = score_each(scorer, images, ["", "", ""], ["a", "b", "c"])
    assert outcome.values.tolist() == [1.0, 0.0, 1.0] and list(outcome.errors) == [1]
    assert outcome.errors[1].reason == "cannot read" and scorer.calls == 4  # the batch, then one by one
    outcome = score_each(_FailsOn(down=True), images, ["", "", ""], ["a", "b", "c"])
    assert set(outcome.errors) == {0, 1, 2} and outcome.errors[2].reason == "endpoint down"
