"""omnirl.algorithms.advantages and .window: hand-computed values and properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omnirl.algorithms import group_advantages, select_window

DESIGN_REWARDS = torch.tensor([0.3, 0.9, 0.5, 0.7])
DESIGN_GROUPS = torch.tensor([0, 0, 1, 1])


def test_design_example_is_the_global_std_mode():
    # docs/algorithms/index.md, "Group advantages": [0.3, 0.9, 0.5, 0.7] → ≈ [-1.34, +1.34, -0.45, +0.45]. Group means are both 0.6;
    # the batch population std is sqrt((0.09 + 0.09 + 0.01 + 0.01)/4) = sqrt(0.05) = 0.2236068.
    result = group_advantages(DESIGN_REWARDS, DESIGN_GROUPS, std_mode="global")
    std = math.sqrt(0.05) + 1e-4
    expected = torch.tensor([-0.3 / std, 0.3 / std, -0.1 / std, 0.1 / std])
    torch.testing.assert_close(result.advantages, expected)
    torch.testing.assert_close(result.advantages, torch.tensor([-1.3410, 1.3410, -0.4470, 0.4470]), atol=1e-4,
                               rtol=0)
    assert (result.zero_std_groups, result.num_groups) == (0, 2)


def test_group_std_mode_hand_computed():
    # Per-group population std: [0.3, 0.9] → 0.3, [0.5, 0.7] → 0.1.
    result = group_advantages(DESIGN_REWARDS, DESIGN_GROUPS, std_mode="group")
    expected = torch.tensor([-0.3 / 0.3001, 0.3 / 0.3001, -0.1 / 0.1001, 0.1 / 0.1001])
    torch.testing.assert_close(result.advantages, expected)


def test_zero_std_groups_are_zero_and_counted_in_both_modes():
    rewards = torch.tensor([0.4, 0.4, 0.4, 0.1, 0.3, 0.7])
    groups = torch.tensor([7, 7, 7, -2, -2, 11])  # arbitrary ids; group 11 has one member
    for mode in ("group", "global"):
        result = group_advantages(rewards, groups, std_mode=mode)
        assert (result.zero_std_groups, result.num_groups) == (2, 3)
        assert result.advantages[[0, 1, 2, 5]].tolist() == [0.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(group_advantages(rewards, groups).advantages[3:5],
                               torch.tensor([-0.1 / 0.1001, 0.1 / 0.1001]))


def test_clip_hand_computed():
    # One success among 30: mean 1/30, population std sqrt(29)/30 → A_0 = (29/30)/(sqrt(29)/30) = 5.385 → 5.
    rewards = torch.tensor([1.0] + [0.0] * 29)
    result = group_advantages(rewards, torch.zeros(30, dtype=torch.int64), clip=5.0)
    assert result.advantages[0] == 5.0
    torch.testing.assert_close(result.advantages[1:], torch.full((29,), -(1 / 30) / (math.sqrt(29) / 30 + 1e-4)))


def test_non_finite_rewards_raise_naming_indices():
    with pytest.raises(ValueError, match=r"indices \[1, 3\]"):
        group_advantages(torch.tensor([0.1, math.nan, 0.3, math.inf]), torch.tensor([0, 0, 1, 1]))


@pytest.mark.parametrize("kwargs, message", [({"std_mode": "batch"}, "std_mode must be one of"),
                                             ({"eps": -1.0}, "eps must be finite and >= 0"),
                                             ({"clip": 0.0}, "clip must be > 0")])
def test_bad_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        group_advantages(DESIGN_REWARDS, DESIGN_GROUPS, **kwargs)


def test_bad_group_ids_raise():
    with pytest.raises(TypeError, match="int64"):
        group_advantages(DESIGN_REWARDS, DESIGN_GROUPS.int())
    with pytest.raises(ValueError, match="shape"):
        group_advantages(DESIGN_REWARDS, DESIGN_GROUPS[:3])


@settings(max_examples=60, deadline=None)
@given(groups=st.lists(st.lists(st.integers(0, 8), min_size=1, max_size=8), min_size=1, max_size=6))
def test_advantages_sum_to_zero_per_group(groups):
    # Rewards k/8 are exact in float32; group size ≤ 8 keeps |A| ≤ sqrt(7) < 5, so the clip never acts.
    rewards = torch.tensor([k / 8 for group in groups for k in group])
    ids = torch.tensor([g for g, group in enumerate(groups) for _ in group])
    result = group_advantages(rewards, ids, std_mode="group")
    constant = [len(set(group)) == 1 for group in groups]
    assert result.num_groups == len(groups) and result.zero_std_groups == sum(constant)
    for g, group_is_constant in enumerate(constant):
        adv = result.advantages[ids == g]
        if group_is_constant:
            assert adv.tolist() == [0.0] * len(adv)
        else:
            assert abs(float(adv.sum())) < 1e-5
            assert float(adv.abs().max()) <= math.sqrt(len(adv) - 1) + 1e-5


# --- window -------------------------------------------------------------------------------------


def test_window_is_deterministic_per_seed_and_varies_across_seeds():
    windows = {seed: select_window(seed, 10, 2, (0, 5)) for seed in range(20)}
    assert all(select_window(seed, 10, 2, (0, 5)) == w for seed, w in windows.items())
    assert len({tuple(w) for w in windows.values()}) > 1
    for w in windows.values():
        assert len(w) == 2 and w[1] == w[0] + 1 and 0 <= w[0] and w[1] <= 4


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), num_steps=st.integers(2, 40), data=st.data())
def test_window_never_includes_the_last_step(seed, num_steps, data):
    window_size = data.draw(st.integers(1, num_steps - 1))
    lo = data.draw(st.integers(0, num_steps - 1 - window_size))
    hi = data.draw(st.integers(lo + window_size, num_steps - 1))
    window = select_window(seed, num_steps, window_size, (lo, hi))
    assert window == list(range(window[0], window[0] + window_size))
    assert lo <= window[0] and window[-1] < hi and num_steps - 1 not in window


def test_window_covers_every_start_uniformly():
    starts = [select_window(seed, 10, 3, (1, 7))[0] for seed in range(400)]
    counts = [starts.count(s) for s in range(1, 5)]  # starts 1..4 (= hi - window_size)
    assert sum(counts) == 400 and min(counts) > 60


@pytest.mark.parametrize("num_steps, window_size, window_range, match", [
    (10, 2, (0, 10), "last step"),       # hi = 10 would allow index 9
    (10, 2, (8, 10), "last step"),
    (10, 3, (5, 7), "does not fit"),     # only 2 steps in range(5, 7)
    (10, 1, (-1, 4), "does not fit"),
    (10, 0, (0, 4), "window_size >= 1"),
    (1, 1, (0, 0), "num_steps >= 2"),
])
def test_window_bad_ranges_raise_naming_parameters(num_steps, window_size, window_range, match):
    with pytest.raises(ValueError, match=match) as info:
        select_window(0, num_steps, window_size, window_range)
    assert f"num_steps={num_steps}" in str(info.value) and f"window_range={window_range}" in str(info.value)
