"""omnirl.algorithms.awm (Advantage Weighted Matching): hand-computed values, gradients and properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omnirl.algorithms import (
    awm_advantages,
    awm_loss,
    grid_indices,
    matching_error,
    stratified_sigmas,
    weighted_matching,
)
from omnirl.api.spec import AlgorithmSpec


def test_advantages_are_clamped_then_rescaled():
    got = awm_advantages(torch.tensor([-7.0, -2.5, 0.0, 5.0]), clip=5.0, advantage_max=1.0)
    torch.testing.assert_close(got, torch.tensor([-1.0, -0.5, 0.0, 1.0]))
    torch.testing.assert_close(awm_advantages(torch.tensor([1.0]), 2.0, 3.0), torch.tensor([1.5]))
    with pytest.raises(ValueError, match="clip"):
        awm_advantages(torch.ones(2), clip=0.0)


def test_matching_error_is_the_flow_matching_loss():
    x0 = torch.tensor([[0.0, 1.0], [2.0, -1.0]])
    eps = torch.tensor([[1.0, 1.0], [0.0, 0.0]])  # targets ε − x0: [1, 0], [−2, 1]
    v = torch.tensor([[1.0, 2.0], [0.0, 1.0]])
    torch.testing.assert_close(matching_error(v, x0, eps), torch.tensor([(0 + 4) / 2, (4 + 0) / 2]))
    with pytest.raises(ValueError, match="same shape"):
        matching_error(v, x0, eps[:1])


ELL, SIGMA = 0.0625, 0.5  # ℓ^¼ = 0.5, √ℓ = 0.25
DELTA = 1e-10


@pytest.mark.parametrize("weighting, value, slope", [
    ("uniform", ELL, 1.0),
    ("t", SIGMA * ELL, SIGMA),
    ("t2", SIGMA**2 * ELL, SIGMA**2),
    ("huber", SIGMA * (math.sqrt(ELL + DELTA) - DELTA), SIGMA * 0.5 / 0.25),  # σ/(2√ℓ) = 1
    # ghuber p = ¼: σ/p·((ℓ+δ)^p − δ^p) = 2·(0.5 − 10^-2.5); ∂/∂ℓ = σ·ℓ^(p−1) = 0.5·8 = 4
    ("ghuber", SIGMA / 0.25 * ((ELL + DELTA) ** 0.25 - DELTA**0.25), 4.0),
])
def test_weightings_hand_values_and_slopes(weighting, value, slope):
    err = torch.tensor([ELL], requires_grad=True)
    out = weighted_matching(err, torch.tensor([SIGMA]), weighting, power=0.25)
    assert out.item() == pytest.approx(value, rel=1e-6)
    out.sum().backward()
    assert err.grad.item() == pytest.approx(slope, rel=1e-5)


def test_ghuber_subtracts_the_delta_power():
    # a sample already matched (ℓ = 0) contributes 0, not σ/p·δ^p
    assert weighted_matching(torch.zeros(1), torch.ones(1), "ghuber").item() == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("kwargs, match", [
    ({"weighting": "huberish"}, "weighting must be one of"),
    ({"power": 0.0}, "power"),
    ({"sigma": torch.tensor([1.5])}, "sigma must lie"),
    ({"error": torch.tensor([-1.0])}, "error must be >= 0"),
])
def test_weighting_bad_input_raises(kwargs, match):
    args = {"error": torch.tensor([0.5]), "sigma": torch.tensor([0.5]), "weighting": "ghuber", "power": 0.25} | kwargs
    with pytest.raises(ValueError, match=match):
        weighted_matching(**args)


def test_on_policy_gradient_is_advantage_weighted_matching():
    """ratio = 1; ∂loss/∂v_b = A_b/(B·K)·∂ℓ_b/∂v_b: a good sample is pulled to its target, a bad one pushed off.

    x0 = 0, ε = 1 (target 1), v = [0, 0] (A = +1) and [2, 2] (A = −1): ℓ = [1, 1], ∂ℓ/∂v = v − 1,
    so ∂loss/∂v = [+½·(−1), −½·(+1)] = −½ everywhere: a descent step raises both v, i.e. toward 1
    for the good sample and away from 1 for the bad one.
    """
    x0, eps = torch.zeros(2, 2), torch.ones(2, 2)
    v = torch.tensor([[0.0, 0.0], [2.0, 2.0]], requires_grad=True)
    lp = -weighted_matching(matching_error(v, x0, eps), torch.full((2,), 0.5), "uniform")[:, None]
    out = awm_loss(lp, lp.detach(), torch.tensor([1.0, -1.0]), clip_range=1.0)
    assert out.policy_loss.item() == 0.0 and out.ratio_max_abs_dev.item() == 0.0 and out.clip_fraction.item() == 0.0
    out.loss.backward()
    torch.testing.assert_close(v.grad, torch.full((2, 2), -0.5))


def test_clip_and_anchor_terms_hand_example():
    # A = +1, ratio 1.2 (clipped at ε = 0.1, no gradient) and ratio 1.05 (kept)
    old = torch.tensor([[0.0, 0.0]])
    lp = torch.log(torch.tensor([[1.2, 1.05]])).requires_grad_(True)
    kl, ema_kl = torch.tensor([[0.1, 0.3]]), torch.tensor([[0.5, 0.7]])
    out = awm_loss(lp, old, torch.tensor([1.0]), 0.1, kl=kl, kl_coef=0.5, ema_kl=ema_kl, ema_kl_coef=2.0)
    torch.testing.assert_close(out.policy_loss, torch.tensor((-1.1 - 1.05) / 2))
    torch.testing.assert_close(out.kl, torch.tensor(0.2))
    torch.testing.assert_close(out.ema_kl, torch.tensor(0.6))
    torch.testing.assert_close(out.loss, torch.tensor(-1.075 + 0.5 * 0.2 + 2.0 * 0.6))
    assert out.clip_fraction.item() == 0.5
    out.loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, -1.05 / 2]]))


@pytest.mark.parametrize("kwargs, match", [
    ({"kl_coef": 0.1}, "kl_coef=0.1 > 0 needs kl"),
    ({"ema_kl_coef": 1.0}, "ema_kl_coef=1.0 > 0 needs ema_kl"),
    ({"kl": torch.zeros(3, 1), "kl_coef": 0.1}, "same shape"),
    ({"ema_kl_coef": -1.0}, "ema_kl_coef must be >= 0"),
    ({"clip_range": 0.0}, "clip_range"),
])
def test_awm_loss_bad_input_raises(kwargs, match):
    args = {"log_prob": torch.zeros(2, 1), "old_log_prob": torch.zeros(2, 1), "advantages": torch.zeros(2),
            "clip_range": 1.0} | kwargs
    with pytest.raises(ValueError, match=match):
        awm_loss(**args)


def test_grid_indices_stratify_the_trainable_steps():
    # N = 10, fraction 0.9 → trainable grid steps [1, 9): four strata of two steps each
    assert grid_indices(10, 0.9, 4, torch.zeros(4)).tolist() == [1, 3, 5, 7]
    assert grid_indices(10, 0.9, 4, torch.full((4,), 0.999)).tolist() == [2, 4, 6, 8]
    assert grid_indices(6, 1.0, 1, torch.tensor([0.5])).tolist() == [3]  # [1, 6): 1 + ⌊0.5·5⌋
    with pytest.raises(ValueError, match="need >= 2"):
        grid_indices(2, 0.5, 1, torch.zeros(1))
    with pytest.raises(ValueError, match=r"u must lie in \[0, 1\)"):
        grid_indices(10, 0.9, 2, torch.tensor([0.0, 1.0]))


def test_stratified_sigmas_hand_values():
    torch.testing.assert_close(stratified_sigmas((0.2, 1.0), 4, torch.full((4,), 0.5)),
                               torch.tensor([0.3, 0.5, 0.7, 0.9]))
    with pytest.raises(ValueError, match="sigma_range"):
        stratified_sigmas((0.5, 0.5), 1, torch.zeros(1))


@settings(max_examples=30, deadline=None)
@given(k=st.integers(1, 8), n=st.integers(2, 40), u=st.floats(0, 0.999999))
def test_grid_indices_stay_inside_and_cover_in_order(k, n, u):
    idx = grid_indices(n, 1.0, k, torch.full((k,), u))
    assert int(idx.min()) >= 1 and int(idx.max()) <= n - 1
    assert bool((idx[1:] >= idx[:-1]).all())


def test_spec_defaults_are_the_papers_and_grid_needs_two_steps():
    awm = AlgorithmSpec(name="awm").awm
    assert (awm.timestepsPerSample, awm.timestepFraction, awm.weighting, awm.ghuberPower) == (6, 0.9, "ghuber", 0.25)
    assert (awm.advantageMax, awm.clipRange, awm.klCoef, awm.emaKlCoef) == (1.0, 1.0, 0.003, 1.0)
    assert (awm.anchor.schedule, awm.anchor.decayMax, awm.anchor.rampSteps) == ("ema", 0.3, 300)
    with pytest.raises(ValueError, match="awm.timestepFraction"):
        AlgorithmSpec(name="awm", sampling={"numSteps": 2}, awm={"timestepFraction": 0.5})
