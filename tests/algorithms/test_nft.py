"""omnirl.algorithms.nft (DiffusionNFT): hand-computed values and properties."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omnirl.algorithms import ema_update_, implicit_velocities, nft_loss, old_policy_decay, optimality_probability


def test_optimality_probability_hand_values():
    advantages = torch.tensor([-10.0, -5.0, 0.0, 2.5, 5.0, 7.0])
    assert optimality_probability(advantages).tolist() == [0.0, 0.0, 0.5, 0.75, 1.0, 1.0]
    with pytest.raises(ValueError, match="advantage_max"):
        optimality_probability(advantages, advantage_max=0.0)


@settings(max_examples=40, deadline=None)
@given(v_theta=st.lists(st.floats(-8, 8, width=32), min_size=4, max_size=4),
       v_old=st.lists(st.floats(-8, 8, width=32), min_size=4, max_size=4), beta=st.floats(0.01, 2.0))
def test_implicit_velocities_average_to_v_old(v_theta, v_old, beta):
    # v⁺ and v⁻ are mirror images around v_old: (v⁺ + v⁻)/2 = v_old, v⁺ - v⁻ = 2β(v_θ - v_old).
    vt, vo = torch.tensor(v_theta).reshape(2, 2), torch.tensor(v_old).reshape(2, 2)
    v_plus, v_minus = implicit_velocities(vt, vo, beta)
    torch.testing.assert_close((v_plus + v_minus) / 2, vo, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v_plus - v_minus, 2 * beta * (vt - vo), atol=1e-5, rtol=1e-5)


def test_nft_loss_hand_example():
    # β = 0.5, r = 0.75, σ = 0.5:
    # v⁺ = 0.5·[0, 2] + 0.5·[1, 1] = [0.5, 1.5]; x̂0⁺ = [0.5, 0.5] - 0.5·v⁺ = [0.25, -0.25];
    #   x̂0⁺ - x0 = [-0.75, 0.75] → err⁺ = 0.5625, w⁺ = 0.75 → err⁺/w⁺ = 0.75
    # v⁻ = 1.5·[1, 1] - 0.5·[0, 2] = [1.5, 0.5]; x̂0⁻ = [-0.25, 0.25];
    #   x̂0⁻ - x0 = [-1.25, 1.25] → err⁻ = 1.5625, w⁻ = 1.25 → err⁻/w⁻ = 1.25
    # loss = 0.75·0.75 + 0.25·1.25 = 0.5625 + 0.3125 = 0.875
    x0 = torch.tensor([[1.0, -1.0]])
    x_t = torch.tensor([[0.5, 0.5]])
    v_theta = torch.tensor([[0.0, 2.0]], requires_grad=True)
    v_old = torch.tensor([[1.0, 1.0]], requires_grad=True)
    out = nft_loss(x0, x_t, torch.tensor([0.5]), v_theta, v_old, torch.tensor([0.75]), beta=0.5)
    torch.testing.assert_close(out.loss, torch.tensor(0.875))
    torch.testing.assert_close(out.positive_loss, torch.tensor(0.5625))
    torch.testing.assert_close(out.negative_loss, torch.tensor(0.3125))
    out.loss.backward()
    # d/dv_θ: r/w⁺·(x̂0⁺ - x0)·(-σβ) + (1-r)/w⁻·(x̂0⁻ - x0)·(+σβ)
    #       = 1·[-0.75, 0.75]·(-0.25) + 0.2·[-1.25, 1.25]·0.25 = [0.1875, -0.1875] + [-0.0625, 0.0625]
    torch.testing.assert_close(v_theta.grad, torch.tensor([[0.125, -0.125]]))
    assert v_old.grad is None  # v_old is a constant


def test_nft_loss_perfect_prediction_is_zero_not_nan():
    x0 = torch.tensor([[0.3, -0.2]])
    v = torch.tensor([[0.0, 0.0]], requires_grad=True)
    out = nft_loss(x0, x0.clone(), torch.tensor([0.5]), v, v.detach(), torch.tensor([0.5]), beta=1.0)
    assert out.loss.item() == 0.0
    out.loss.backward()
    assert torch.equal(v.grad, torch.zeros(1, 2))


@pytest.mark.parametrize("kwargs, match", [({"beta": 0.0}, "beta"), ({"r": torch.tensor([1.5])}, "r must lie"),
                                           ({"sigma": torch.tensor([-0.1])}, "sigma must lie")])
def test_nft_loss_bad_input_raises(kwargs, match):
    args = {"x0": torch.zeros(1, 2), "x_t": torch.zeros(1, 2), "sigma": torch.tensor([0.5]),
            "v_theta": torch.zeros(1, 2), "v_old": torch.zeros(1, 2), "r": torch.tensor([0.5]), "beta": 1.0} | kwargs
    with pytest.raises(ValueError, match=match):
        nft_loss(**args)


def test_old_policy_decay_schedules():
    assert [old_policy_decay(step) for step in (0, 10, 1000)] == [0.0, 0.0, 0.0]
    ema = [old_policy_decay(step, "ema", decay_max=0.999, ramp_steps=100) for step in (0, 50, 100, 1000)]
    assert ema == pytest.approx([0.0, 0.4995, 0.999, 0.999])
    with pytest.raises(ValueError, match="schedule"):
        old_policy_decay(0, "linear")
    with pytest.raises(ValueError, match="decay_max"):
        old_policy_decay(0, "ema", decay_max=1.0)


def test_ema_update_in_place():
    old = [torch.tensor([1.0, 2.0]), torch.tensor([4.0], dtype=torch.bfloat16)]
    new = [torch.tensor([3.0, 4.0], requires_grad=True), torch.tensor([8.0], dtype=torch.bfloat16)]
    ema_update_(old, new, decay=0.75)
    assert old[0].tolist() == [1.5, 2.5] and old[1].tolist() == [5.0] and old[1].dtype == torch.bfloat16
    assert not old[0].requires_grad
    ema_update_(old, new, decay=0.0)
    assert old[0].tolist() == [3.0, 4.0] and old[1].tolist() == [8.0]
    with pytest.raises(ValueError, match="1 tensors but new has 2"):
        ema_update_(old[:1], new, decay=0.5)
    with pytest.raises(ValueError, match="tensor 0"):
        ema_update_([torch.zeros(3)], [torch.zeros(2)], decay=0.5)
