"""omnirl.algorithms.flow_grpo, .kl and .rollout_correction: hand-computed values and properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omnirl.algorithms import auto_band, flow_grpo_loss, gaussian_kl, is_diagnostics, rs_mask

# Two samples × two trained steps, clip ε = 0.1:
#   (0,0) A=+1, ratio 1.2  → max(-1.2, -1.1) = -1.1   clipped (|r-1| = 0.2 > ε)
#   (0,1) A=+1, ratio 1.05 → max(-1.05, -1.05) = -1.05
#   (1,0) A=-1, ratio 0.8  → max(0.8, 0.9) = 0.9      clipped
#   (1,1) A=-1, ratio 1.0  → 1.0
RATIOS = torch.tensor([[1.2, 1.05], [0.8, 1.0]])
ADVANTAGES = torch.tensor([1.0, -1.0])


def _log_probs() -> tuple[torch.Tensor, torch.Tensor]:
    old = torch.tensor([[-0.5, 0.25], [1.0, -2.0]])
    return (old + RATIOS.log()).requires_grad_(True), old


def test_flow_grpo_loss_clipping_hand_example():
    log_prob, old = _log_probs()
    out = flow_grpo_loss(log_prob, old, ADVANTAGES, clip_range=0.1)
    torch.testing.assert_close(out.loss, torch.tensor((-1.1 - 1.05 + 0.9 + 1.0) / 4))
    assert out.clip_fraction.item() == 0.5
    torch.testing.assert_close(out.ratio_mean, torch.tensor(4.05 / 4))
    torch.testing.assert_close(out.ratio_max_abs_dev, torch.tensor(0.2))
    assert out.kl_loss.item() == 0.0 and not out.policy_loss.requires_grad
    out.loss.backward()
    # Clipped entries carry no gradient; d(-A·ratio)/d log_prob = -A·ratio, over 4 entries.
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.0, -1.05 / 4], [0.0, 1.0 / 4]]))


def test_flow_grpo_loss_sample_weight_and_kl():
    log_prob, old = _log_probs()
    kl = torch.tensor([[0.1, 0.3], [0.5, 0.7]])
    out = flow_grpo_loss(log_prob, old, ADVANTAGES, 0.1, kl=kl, kl_coef=0.5, sample_weight=torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(out.policy_loss, torch.tensor((-1.1 - 1.05) / 2))
    torch.testing.assert_close(out.kl_loss, torch.tensor(0.2))
    torch.testing.assert_close(out.loss, torch.tensor(-1.075 + 0.5 * 0.2))
    assert out.clip_fraction.item() == 0.5  # one of the two kept entries
    full = flow_grpo_loss(log_prob, old, ADVANTAGES, 0.1, kl=kl, kl_coef=0.5)
    torch.testing.assert_close(full.loss, torch.tensor(-0.0625 + 0.5 * 0.4))


def test_flow_grpo_loss_all_rejected_is_zero_with_grad():
    log_prob, old = _log_probs()
    out = flow_grpo_loss(log_prob, old, ADVANTAGES, 0.1, sample_weight=torch.tensor([False, False]))
    assert out.loss.item() == 0.0 and out.loss.requires_grad and out.clip_fraction.item() == 0.0
    out.loss.backward()
    assert torch.equal(log_prob.grad, torch.zeros(2, 2))


@pytest.mark.parametrize("kwargs, match", [
    ({"clip_range": 0.0}, "clip_range"),
    ({"kl_coef": 0.1}, "needs the per-step kl"),
    ({"advantages": torch.ones(3)}, "advantages must have shape"),
    ({"sample_weight": torch.tensor([1.0, -1.0])}, "sample_weight must be >= 0"),
])
def test_flow_grpo_loss_bad_input_raises(kwargs, match):
    log_prob, old = _log_probs()
    args = {"log_prob": log_prob, "old_log_prob": old, "advantages": ADVANTAGES, "clip_range": 0.1} | kwargs
    with pytest.raises(ValueError, match=match):
        flow_grpo_loss(**args)


@settings(max_examples=40, deadline=None)
@given(log_prob=st.lists(st.floats(-50, 50, width=32), min_size=6, max_size=6),
       advantages=st.lists(st.floats(-5, 5, width=32), min_size=3, max_size=3))
def test_on_policy_ratio_is_one_and_loss_is_minus_mean_advantage(log_prob, advantages):
    lp = torch.tensor(log_prob).reshape(3, 2)
    adv = torch.tensor(advantages)
    out = flow_grpo_loss(lp, lp.clone(), adv, clip_range=1e-4)
    assert out.ratio_mean.item() == 1.0 and out.ratio_max_abs_dev.item() == 0.0 and out.clip_fraction.item() == 0.0
    torch.testing.assert_close(out.loss, -adv.mean())


# --- KL -----------------------------------------------------------------------------------------


def test_gaussian_kl_hand_example():
    mean = torch.tensor([[1.0, 2.0], [1.0, 1.0]])
    ref = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    # sample 0: mean(1, 4)/(2·1²) = 1.25; sample 1: mean(1, 1)/(2·2²) = 0.125
    torch.testing.assert_close(gaussian_kl(mean, ref, torch.tensor([1.0, 2.0])), torch.tensor([1.25, 0.125]))
    with pytest.raises(ValueError, match=r"indices \[0\]"):
        gaussian_kl(mean, ref, torch.tensor([0.0, 2.0]))


@settings(max_examples=50, deadline=None)
@given(ref=st.lists(st.integers(-256, 256), min_size=4, max_size=4),
       delta=st.lists(st.integers(-3, 3), min_size=4, max_size=4), std=st.floats(0.01, 10.0))
def test_gaussian_kl_is_zero_iff_means_equal(ref, delta, std):
    mean_ref = torch.tensor(ref, dtype=torch.float32).reshape(1, 4) / 64
    mean = mean_ref + torch.tensor(delta, dtype=torch.float32).reshape(1, 4) / 64
    kl = gaussian_kl(mean, mean_ref, torch.tensor([std]))
    assert (kl.item() == 0.0) == all(d == 0 for d in delta)
    assert kl.item() >= 0.0


# --- rollout correction -------------------------------------------------------------------------


def test_is_diagnostics_hand_example():
    rollout = torch.tensor([[-1.0, -2.0], [0.5, 0.25]])
    log_prob = rollout + torch.tensor([[0.1, 0.2], [-0.3, 0.0]])
    diag = is_diagnostics(log_prob, rollout)
    torch.testing.assert_close(diag.seq_log_is, torch.tensor([0.3, -0.3]))
    assert diag.mean_log_ratio == pytest.approx(0.0, abs=1e-7)
    assert diag.is_weight_mean == pytest.approx(math.cosh(0.3), rel=1e-6)
    assert diag.ess == pytest.approx(math.cosh(0.3) ** 2 / math.cosh(0.6), rel=1e-6)  # (Σw)²/(2Σw²)
    assert diag.max_abs_log_ratio == pytest.approx(0.3, rel=1e-6)
    on_policy = is_diagnostics(rollout, rollout)
    assert on_policy.ess == 1.0 and on_policy.is_weight_mean == 1.0 and on_policy.max_abs_log_ratio == 0.0


def test_is_diagnostics_rejects_nan():
    with pytest.raises(ValueError, match=r"\[\[1, 0\]\]"):
        is_diagnostics(torch.tensor([[0.0], [math.nan]]), torch.zeros(2, 1))


def test_rs_mask_band_edges_are_inclusive():
    weights = torch.tensor([0.5, 0.5 * (1 - 1e-3), 2.0, 2.0 * (1 + 1e-3), 1.0])
    seq_log_is = torch.cat([weights.log(), torch.tensor([math.inf, -math.inf])])
    assert rs_mask(seq_log_is, (0.5, 2.0)).tolist() == [True, False, True, False, True, False, False]


@pytest.mark.parametrize("band", [(1.0, 2.0), (0.5, 1.0), (0.0, 2.0), (2.0, 0.5)])
def test_rs_mask_rejects_bad_bands(band):
    with pytest.raises(ValueError, match="0 < lo < 1 < hi"):
        rs_mask(torch.zeros(2), band)


def test_rs_mask_rejects_nan():
    with pytest.raises(ValueError, match=r"indices \[1\]"):
        rs_mask(torch.tensor([0.0, math.nan]), (0.5, 2.0))


def test_auto_band_rule():
    seq_log_is = torch.tensor([0.1, -0.2, 0.3, -1.0, 0.05])  # |.| sorted: 0.05, 0.1, 0.2, 0.3, 1.0
    assert auto_band(seq_log_is, quantile=1.0) == pytest.approx((math.exp(-1.0), math.exp(1.0)))
    # q = 0.9 → position 3.6 → 0.3 + 0.6·0.7 = 0.72 (linear interpolation)
    assert auto_band(seq_log_is, quantile=0.9) == pytest.approx((math.exp(-0.72), math.exp(0.72)))
    # median 0.2 is narrower than the default minimum log 2 → [1/2, 2]
    assert auto_band(seq_log_is, quantile=0.5) == pytest.approx((0.5, 2.0))
    lo, hi = auto_band(seq_log_is, quantile=0.9)
    assert rs_mask(seq_log_is, (lo, hi)).tolist() == [True, True, True, False, True]
    with pytest.raises(ValueError, match="quantile"):
        auto_band(seq_log_is, quantile=0.0)
    with pytest.raises(ValueError, match="min_width"):
        auto_band(seq_log_is, min_width=0.0)
