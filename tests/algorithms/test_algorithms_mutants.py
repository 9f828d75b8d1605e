"""Bad input to every public `omnirl.algorithms` function raises naming the argument and the value.

Written from the survivors of the mutation run (`make mutation`): input checks whose condition or
message could be changed without any test noticing. Each case gives the exact error type and a
message fragment that names the argument (house rule: an error names the field and the fix), and
boundary cases that must still pass.
"""

from __future__ import annotations

import math

import pytest
import torch

from omnirl.algorithms import (
    auto_band,
    flow_grpo_loss,
    gaussian_kl,
    gaussian_log_prob,
    group_advantages,
    is_diagnostics,
    rs_mask,
    sde_mean_std,
    sde_step,
    select_window,
    sigma_schedule,
)

X = torch.zeros(2, 1, 2, 2)
LP = torch.zeros(2, 3)
ADV = torch.zeros(2)
R = torch.tensor([0.1, 0.2])
G = torch.tensor([0, 0])

CASES = {
    # sigma_schedule / select_window: ints, named
    "sigma-float-steps": (lambda: sigma_schedule(2.0), ValueError, r"num_steps must be an int >= 1, got 2\.0"),
    "sigma-bool-steps": (lambda: sigma_schedule(True), ValueError, r"num_steps must be an int >= 1, got True"),
    "window-float-seed": (lambda: select_window(1.0, 10, 2, (0, 5)), TypeError, r"^seed must be an int, got float"),
    "window-bool-steps": (lambda: select_window(1, True, 2, (0, 5)), TypeError, r"^num_steps must be an int, got bool"),
    "window-float-size": (lambda: select_window(1, 10, 2.0, (0, 5)), TypeError, r"^window_size must be an int"),
    "window-float-range": (lambda: select_window(1, 10, 2, (0.0, 5)), TypeError, r"window_range\[0\] must be an int"),
    "window-one-step": (lambda: select_window(1, 1, 1, (0, 0)), ValueError, r"need num_steps >= 2 and window_size >= 1"),
    "window-zero-size": (lambda: select_window(1, 10, 0, (0, 5)), ValueError, r"need num_steps >= 2 and window_size >= 1"),
    "window-last-step": (lambda: select_window(1, 10, 2, (0, 10)), ValueError, r"would include the last step \(index 9\)"),
    "window-negative-lo": (lambda: select_window(1, 10, 2, (-1, 5)), ValueError, r"window does not fit"),
    "window-too-narrow": (lambda: select_window(1, 10, 3, (2, 4)), ValueError, r"window does not fit"),
    # group_advantages
    "adv-2d-rewards": (lambda: group_advantages(R[None], G[None]), ValueError, r"rewards must have shape \[N\] with N >= 1, got \(1, 2\)"),
    "adv-empty": (lambda: group_advantages(R[:0], G[:0]), ValueError, r"rewards must have shape \[N\] with N >= 1, got \(0,\)"),
    "adv-int-rewards": (lambda: group_advantages(torch.tensor([1, 2]), G), TypeError, r"rewards must be a floating-point tensor, got dtype torch.int64"),
    "adv-list-rewards": (lambda: group_advantages([0.1, 0.2], G), TypeError, r"rewards must be a torch.Tensor, got list"),
    "adv-int32-groups": (lambda: group_advantages(R, G.int()), TypeError, r"group_ids must be an int64 tensor, got torch.int32"),
    "adv-list-groups": (lambda: group_advantages(R, [0, 0]), TypeError, r"group_ids must be an int64 tensor, got <class 'list'>"),
    "adv-group-shape": (lambda: group_advantages(R, torch.tensor([0])), ValueError, r"group_ids \(1,\) must have the shape of rewards \(2,\)"),
    "adv-nan-eps": (lambda: group_advantages(R, G, eps=math.nan), ValueError, r"eps must be finite and >= 0, got nan"),
    "adv-inf-eps": (lambda: group_advantages(R, G, eps=math.inf), ValueError, r"eps must be finite and >= 0, got inf"),
    "adv-nan-reward": (lambda: group_advantages(torch.tensor([0.1, math.nan]), G), ValueError, r"NaN/inf at indices \[1\] \(values \[nan\]\): fix the reward function"),
    # flow_grpo_loss
    "grpo-clip": (lambda: flow_grpo_loss(LP, LP, ADV, 0.0), ValueError, r"clip_range must be > 0, got 0\.0"),
    "grpo-nan-clip": (lambda: flow_grpo_loss(LP, LP, ADV, math.nan), ValueError, r"clip_range must be > 0, got nan"),
    "grpo-kl-coef": (lambda: flow_grpo_loss(LP, LP, ADV, 0.1, kl_coef=-1.0), ValueError, r"kl_coef must be >= 0, got -1\.0"),
    "grpo-kl-missing": (lambda: flow_grpo_loss(LP, LP, ADV, 0.1, kl_coef=0.5), ValueError, r"kl_coef=0\.5 > 0 needs the per-step kl \[B, T\]"),
    "grpo-1d": (lambda: flow_grpo_loss(ADV, ADV, ADV, 0.1), ValueError, r"log_prob must have shape \[B, T\] with B, T >= 1, got \(2,\)"),
    "grpo-empty-t": (lambda: flow_grpo_loss(LP[:, :0], LP[:, :0], ADV, 0.1), ValueError, r"log_prob must have shape \[B, T\] with B, T >= 1, got \(2, 0\)"),
    "grpo-empty-b": (lambda: flow_grpo_loss(LP[:0], LP[:0], ADV[:0], 0.1), ValueError, r"log_prob must have shape \[B, T\] with B, T >= 1, got \(0, 3\)"),
    "grpo-old-shape": (lambda: flow_grpo_loss(LP, LP[:, :2], ADV, 0.1), ValueError, r"old_log_prob must have shape \[2, 3\] to match log_prob \[B, T\], got \(2, 2\)"),
    "grpo-adv-shape": (lambda: flow_grpo_loss(LP, LP, ADV[:1], 0.1), ValueError, r"advantages must have shape \[2\] to match log_prob \[B, T\], got \(1,\)"),
    "grpo-kl-shape": (lambda: flow_grpo_loss(LP, LP, ADV, 0.1, kl=ADV, kl_coef=1.0), ValueError, r"kl must have shape \[2, 3\]"),
    "grpo-weight-shape": (lambda: flow_grpo_loss(LP, LP, ADV, 0.1, sample_weight=LP), ValueError, r"sample_weight must have shape \[2\]"),
    "grpo-negative-weight": (lambda: flow_grpo_loss(LP, LP, ADV, 0.1, sample_weight=torch.tensor([1.0, -1.0])), ValueError, r"sample_weight must be >= 0, got negatives at \[1\]"),
    "grpo-int-log-prob": (lambda: flow_grpo_loss(LP.long(), LP, ADV, 0.1), TypeError, r"^log_prob must be a floating-point tensor"),
    "grpo-int-old": (lambda: flow_grpo_loss(LP, LP.long(), ADV, 0.1), TypeError, r"^old_log_prob must be a floating-point"),
    "grpo-int-adv": (lambda: flow_grpo_loss(LP, LP, ADV.long(), 0.1), TypeError, r"^advantages must be a floating-point"),
    "grpo-int-kl": (lambda: flow_grpo_loss(LP, LP, ADV, 0.1, kl=LP.long(), kl_coef=1.0), TypeError, r"^kl must be a floating-point"),
    # SDE step, log-prob, KL
    "sde-x-empty": (lambda: sde_mean_std(X[:0], X[:0], 0.5, 0.4, 0.7), ValueError, r"^x must have shape \[B, \.\.\.\] with B >= 1 and at least 1 dims, got \(0, 1, 2, 2\)"),
    "sde-x-0d": (lambda: sde_mean_std(torch.tensor(1.0), X, 0.5, 0.4, 0.7), ValueError, r"^x must have shape \[B, \.\.\.\]"),
    "sde-v-int": (lambda: sde_mean_std(X, X.long(), 0.5, 0.4, 0.7), TypeError, r"^v must be a floating-point tensor"),
    "sde-shapes": (lambda: sde_mean_std(X, X[:, :, :1], 0.5, 0.4, 0.7), ValueError, r"^x \(2, 1, 2, 2\) and v \(2, 1, 1, 2\) must have the same shape"),
    "sde-sigma-shape": (lambda: sde_mean_std(X, X, torch.ones(3) * 0.5, 0.4, 0.7), ValueError, r"^sigma must have shape \[B\] = \[2\] \(or be a scalar\), got \(3,\)"),
    "sde-next-shape": (lambda: sde_mean_std(X, X, 0.5, torch.ones(3) * 0.4, 0.7), ValueError, r"^sigma_next must have shape \[B\] = \[2\]"),
    "sde-sigma-order": (lambda: sde_mean_std(X, X, torch.tensor([0.5, 0.3]), 0.4, 0.7), ValueError, r"need 0 <= sigma_next < sigma <= 1 per sample; violated at indices \[1\] \(sigma=\[0\.3"),
    "sde-sigma-equal": (lambda: sde_mean_std(X, X, 0.4, 0.4, 0.7), ValueError, r"violated at indices \[0, 1\]"),
    "sde-sigma-above-1": (lambda: sde_mean_std(X, X, 1.5, 0.4, 0.7), ValueError, r"violated at indices \[0, 1\]"),
    "sde-next-negative": (lambda: sde_mean_std(X, X, 0.5, -0.1, 0.7), ValueError, r"violated at indices \[0, 1\]"),
    "sde-step-int-x": (lambda: sde_step(X.long(), X, 0.5, 0.4, 0.7), TypeError, r"^x must be a floating-point tensor"),
    "logp-shapes": (lambda: gaussian_log_prob(X, X[:1], torch.ones(2)), ValueError, r"^x_next \(2, 1, 2, 2\) and mean \(1, 1, 2, 2\) must have the same shape"),
    "logp-std-zero": (lambda: gaussian_log_prob(X, X, torch.tensor([1.0, 0.0])), ValueError, r"std must be > 0 for a log-density; std <= 0 \(or NaN\) at indices \[1\]"),
    "logp-int-mean": (lambda: gaussian_log_prob(X, X.long(), torch.ones(2)), TypeError, r"^mean must be a floating-point"),
    "kl-shapes": (lambda: gaussian_kl(X, X[:1], torch.ones(2)), ValueError, r"^mean \(2, 1, 2, 2\) and mean_ref \(1, 1, 2, 2\) must have the same shape"),
    "kl-std-zero": (lambda: gaussian_kl(X, X, torch.tensor([0.0, 1.0])), ValueError, r"std must be > 0 for the Gaussian KL; std <= 0 \(or NaN\) at indices \[0\]"),
    "kl-int-ref": (lambda: gaussian_kl(X, X.long(), torch.ones(2)), TypeError, r"^mean_ref must be a floating-point"),
    # rollout correction
    "is-1d": (lambda: is_diagnostics(ADV, ADV), ValueError, r"log_prob must have shape \[B, T\] with B, T >= 1, got \(2,\)"),
    "is-empty": (lambda: is_diagnostics(LP[:, :0], LP[:, :0]), ValueError, r"got \(2, 0\)"),
    "is-nan": (lambda: is_diagnostics(torch.tensor([[0.0, math.nan]]), torch.zeros(1, 2)), ValueError, r"log-probs must be finite; NaN/inf at \(sample, step\)"),
    "rs-2d": (lambda: rs_mask(LP, (0.5, 2.0)), ValueError, r"seq_log_is must have shape \[B\] with B >= 1, got \(2, 3\)"),
    "rs-empty": (lambda: rs_mask(ADV[:0], (0.5, 2.0)), ValueError, r"seq_log_is must have shape \[B\] with B >= 1, got \(0,\)"),
    "rs-nan": (lambda: rs_mask(torch.tensor([0.0, math.nan]), (0.5, 2.0)), ValueError, r"seq_log_is has NaN at indices \[1\]"),
    "rs-int": (lambda: rs_mask(torch.tensor([0, 1]), (0.5, 2.0)), TypeError, r"^seq_log_is must be a floating-point"),
    "rs-band": (lambda: rs_mask(ADV, (1.0, 2.0)), ValueError, r"band=\(lo, hi\) must satisfy 0 < lo < 1 < hi"),
    "band-inf": (lambda: auto_band(torch.tensor([0.0, math.inf])), ValueError, r"seq_log_is has NaN/inf at indices \[1\]"),
    "band-quantile": (lambda: auto_band(ADV, quantile=0.0), ValueError, r"quantile must be in \(0, 1\], got 0\.0"),
    "band-width": (lambda: auto_band(ADV, min_width=math.inf), ValueError, r"min_width \(minimum log half-width\) must be finite and > 0, got inf"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_names_the_argument(case):
    call, error, message = CASES[case]
    with pytest.raises(error, match=message):
        call()


def test_boundaries_that_are_valid():
    assert sigma_schedule(1).tolist() == [1.0, 0.0]  # one step is allowed
    assert select_window(0, 2, 1, (0, 1)) == [0]  # the smallest window: 2 steps, step 0 only
    assert len(select_window(3, 10, 3, (2, 5))) == 3  # exactly as wide as the range allows
    mean, std = sde_mean_std(X, X, 1.0, 0.0, 0.7)  # σ = 1 → σ_next = 0 is a valid step
    assert mean.shape == X.shape and std.shape == (2,)
    assert rs_mask(ADV, (0.5, 2.0)).tolist() == [True, True]
    assert auto_band(torch.tensor([0.1, -0.2]), quantile=1.0)[1] > 1.0
    out = flow_grpo_loss(LP, LP, ADV, 0.1, sample_weight=torch.tensor([True, False]))  # bool weights accepted
    assert float(out.loss) == 0.0
