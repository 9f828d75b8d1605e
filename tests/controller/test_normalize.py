"""Per-reward normalisation, the step's recombination, and the toy group scorer (closed forms)."""

from __future__ import annotations

import numpy as np
import pytest

from omnirl.api.spec import RewardSpec
from omnirl.controller.normalize import combine_step, component_stats, normalize
from omnirl.scorers.base import GroupScorer, ScorerError
from omnirl.scorers.pairwise import PairwiseContrastScorer, win_rates

X = np.array([1.0, 3.0, 2.0, 6.0])
G = np.array([0, 0, 1, 1])


def test_group_zscore_is_plus_minus_one_for_pairs():
    # each group of two: mean in the middle, population std = half the gap → ±1 (up to eps)
    np.testing.assert_allclose(normalize(X, G, "group"), [-1, 1, -1, 1], atol=1e-6)


def test_batch_zscore_and_minmax_closed_form():
    mean, std = 3.0, np.sqrt(((X - 3.0) ** 2).mean())  # std = sqrt(3.5)
    np.testing.assert_allclose(normalize(X, G, "batch"), (X - mean) / std, rtol=1e-6)
    np.testing.assert_allclose(normalize(X, G, "minmax"), [0.0, 0.4, 0.2, 1.0], atol=1e-6)
    np.testing.assert_array_equal(normalize(X, G, "none"), X.astype(np.float32))


def test_equal_values_give_zero_not_nan():
    same = np.full(4, 0.7)
    for mode in ("group", "batch", "minmax"):
        assert np.array_equal(normalize(same, G, mode), np.zeros(4, np.float32)), mode


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="one length"):
        normalize(X, G[:3], "batch")
    with pytest.raises(ValueError, match="unknown"):
        normalize(X, G, "rank")


def spec(name, **kw):
    return RewardSpec(name=name, kind="jpeg", **kw)


def test_combine_step_weights_normalised_components():
    comps = [{"a": 1.0, "b": 10.0}, {"a": 3.0, "b": 10.0}, {"a": 2.0, "b": 0.0}, {"a": 6.0, "b": 20.0}]
    specs = [spec("a", weight=2.0, normalize="group"), spec("b", weight=0.5, normalize="minmax")]
    # a: group z = [-1, 1, -1, 1] · 2; b: minmax over [10, 10, 0, 20] = [.5, .5, 0, 1] · 0.5
    np.testing.assert_allclose(combine_step(specs, comps, G), [-1.75, 2.25, -2.0, 2.5], atol=1e-5)
    # without normalisation the total is the plain weighted sum
    plain = [spec("a", weight=2.0), spec("b", weight=0.5)]
    np.testing.assert_allclose(combine_step(plain, comps, G), [7.0, 11.0, 4.0, 22.0], atol=1e-5)


def test_missing_non_required_component_contributes_nothing_and_is_counted():
    comps = [{"a": 1.0, "b": 4.0}, {"a": 3.0}, {"a": 2.0, "b": 8.0}, {"a": 6.0}]
    specs = [spec("a"), spec("b", required=False, normalize="batch")]
    # b normalised over the two samples that have it: [-1, 1]
    np.testing.assert_allclose(combine_step(specs, comps, G), [0.0, 3.0, 3.0, 6.0], atol=1e-5)
    stats = component_stats(specs, comps)
    assert stats == {"component_missing_a": 0.0, "reward_a": 3.0, "component_std_a": pytest.approx(np.sqrt(3.5)),
                     "component_missing_b": 2.0, "reward_b": 6.0, "component_std_b": 2.0}
    with pytest.raises(ValueError, match="required reward 'b'"):
        combine_step([spec("a"), spec("b")], comps, G)


def test_a_normalised_jobs_train_reward_is_shown_raw_beside_the_constant_trained_mean():
    """A job with `normalize: group` OCR + a `batch` judge at 0.5 + a pairwise reward at 0.1 printed
    `reward 0.050±1.476` on every step's line, the bar and the closing table's `train reward` (0.050 beside a
    held-out 0.600): the trained mean of z-scores is 0 + 0.5·0 + 0.1·½ whatever the model draws. The raw
    weighted sum, on the held-out reward's scale, is shown too."""
    from omnirl.controller.normalize import raw_totals
    from omnirl.controller.report import step_line
    from omnirl.launch.progress import train_reward, validation_table

    comps = [{"a": 1.0, "b": 4.0}, {"a": 3.0}, {"a": 2.0, "b": 8.0}, {"a": 6.0, "b": 0.0}]
    specs = [spec("a", normalize="group"), spec("b", weight=0.5, required=False, normalize="batch")]
    np.testing.assert_allclose(raw_totals(specs, comps), [3.0, 3.0, 6.0, 6.0])  # b left out where absent
    assert combine_step(specs, comps, G).mean() == pytest.approx(0.0, abs=1e-6)  # what the line showed

    step = {"reward_mean": 0.05, "reward_std": 1.476, "step_seconds": 44.9, "images_per_second": 0.1,
            "raw_reward_mean": 0.825, "raw_reward_std": 0.25}
    # the raw sum's mean and spread (the spread was the trained rewards' 1.476 beside the raw mean)
    assert step_line(0, 4, 1, step) == ("step 0 [1/4] reward 0.825±0.250 (raw sum; normalised for training)  44.9 s  "
                                        "0.1 img/s  v1")
    plain = {k: v for k, v in step.items() if not k.startswith("raw_")}  # no normalisation: the line as before
    assert step_line(0, 4, 1, plain) == "step 0 [1/4] reward 0.050±1.476  44.9 s  0.1 img/s  v1"
    assert (train_reward(step), train_reward(plain)) == (0.825, 0.05)

    val = {"event": "validation", "policy_version": 1, "val_reward_mean": 0.6, "val_exact_match": 0.0,
           "val_background_darkness": 0.05, "grid": "g.png"}
    table = validation_table([{**val, "step": 0}, {"event": "step", "step": 0, **step}, {**val, "step": 1}])
    row = next(line for line in table.splitlines() if line.startswith("│ 1 "))
    assert [c.strip() for c in row.split("│")[1:-1]] == ["1", "1", "0.600", "0.000", "0.050", "0.825", "g.png"]


def test_win_rates_closed_form():
    np.testing.assert_allclose(win_rates(np.array([1.0, 2.0, 3.0])), [0.0, 0.5, 1.0])
    np.testing.assert_allclose(win_rates(np.array([1.0, 1.0, 3.0])), [0.25, 0.25, 1.0])
    np.testing.assert_allclose(win_rates(np.array([5.0])), [0.5])


def test_pairwise_contrast_is_a_group_scorer():
    scorer = PairwiseContrastScorer()
    assert isinstance(scorer, GroupScorer)
    flat = np.full((8, 8, 3), 128, np.uint8)
    stripes = flat.copy()
    stripes[::2] = 0  # higher contrast
    checker = flat.copy()
    checker[::2] = 0
    checker[1::2] = 255  # highest contrast
    out = scorer.score_group(np.stack([stripes, flat, checker]), ["p"] * 3, ["0:0:0", "0:0:1", "0:0:2"])
    np.testing.assert_allclose(out, [0.5, 0.0, 1.0])
    assert out.mean() == pytest.approx(0.5)
    with pytest.raises(ScorerError, match="one prompt"):
        scorer.score_group(np.stack([flat, flat]), ["p", "q"], ["a", "b"])
