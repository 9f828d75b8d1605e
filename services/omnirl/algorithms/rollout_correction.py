"""Rollout correction: importance-sampling diagnostics and the rejection-sampling (RS) mask.

Reference: VeRL-Omni rollout correction (github.com/verl-project/verl-omni, docs at
verl-omni.readthedocs.io; experimental there). In `bypass` mode the actor's old log-prob is the
rollout engine's log-prob, which saves a forward pass but lets kernel/precision drift between
the engines leak into the ratio. Per trajectory the sequence-level IS weight is
w_b = exp(Σ_t (log_prob_bt − rollout_log_prob_bt)) over its trained steps; a sample whose w_b
leaves a band [lo, hi] gets loss weight 0 (`flow_grpo_loss(sample_weight=...)`). The right band
is not published, so `auto_band` derives one from the observed distribution.

Implementation details: diagnostics are computed in float64 on detached values and returned as
Python floats (they are logged, never differentiated); the ESS uses w_b / max w (scale
invariant) so it cannot overflow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from omnirl.algorithms._tensors import f32, same_shape

DEFAULT_MIN_HALF_WIDTH = math.log(2.0)
"""auto_band never goes narrower than [1/2, 2] (VeRL-Omni's example band)."""
_MAX_HALF_WIDTH = 700.0  # exp(±700) still fits a float64


@dataclass(frozen=True)
class ISDiagnostics:
    """Result of `is_diagnostics`.

    Attributes:
        seq_log_is: `[B]` float32 detached, log w_b = Σ_t (log_prob − rollout_log_prob).
        mean_log_ratio: mean over all (b, t) of log_prob − rollout_log_prob.
        is_weight_mean: mean_b exp(seq_log_is_b) (1 on-policy; may be inf when far off-policy).
        ess: effective sample size (Σw)²/(B·Σw²) ∈ (0, 1]; 1 when every weight is equal.
        max_abs_log_ratio: max over (b, t) of |log_prob − rollout_log_prob| (~1e-5 or less
            when both engines agree; far above it = kernel/precision drift).
    """

    seq_log_is: Tensor
    mean_log_ratio: float
    is_weight_mean: float
    ess: float
    max_abs_log_ratio: float


def _finite_seq_log_is(seq_log_is: Tensor, allow_inf: bool) -> Tensor:
    seq_log_is = f32(seq_log_is, "seq_log_is").detach()
    if seq_log_is.dim() != 1 or seq_log_is.numel() == 0:
        raise ValueError(f"seq_log_is must have shape [B] with B >= 1, got {tuple(seq_log_is.shape)}")
    bad_mask = seq_log_is.isnan() if allow_inf else ~seq_log_is.isfinite()
    if bool(bad_mask.any()):
        kind = "NaN" if allow_inf else "NaN/inf"
        raise ValueError(f"seq_log_is has {kind} at indices {bad_mask.nonzero().flatten().tolist()}: "
                         "a log-prob upstream is broken")
    return seq_log_is


def _log_ratio(log_prob: Tensor, rollout_log_prob: Tensor) -> Tensor:
    """log_prob − rollout_log_prob `[B, T]` float64, detached, after checking both (floating point,
    one `[B, T]` shape with B, T ≥ 1, every difference finite: a NaN/inf names its (sample, step))."""
    log_prob = f32(log_prob, "log_prob").detach()
    rollout_log_prob = f32(rollout_log_prob, "rollout_log_prob").detach()
    same_shape(log_prob, rollout_log_prob, "log_prob", "rollout_log_prob")
    if log_prob.dim() != 2 or 0 in log_prob.shape:
        raise ValueError(f"log_prob must have shape [B, T] with B, T >= 1, got {tuple(log_prob.shape)}")
    log_ratio = log_prob.double() - rollout_log_prob.double()
    bad = ~log_ratio.isfinite()
    if bool(bad.any()):
        raise ValueError(f"log-probs must be finite; NaN/inf at (sample, step) {bad.nonzero().tolist()}")
    return log_ratio


def is_diagnostics(log_prob: Tensor, rollout_log_prob: Tensor) -> ISDiagnostics:
    """Importance-sampling diagnostics between the trainer's and the rollout engine's log-probs.

    Args:
        log_prob: `[B, T]` log-probs of the trained steps recomputed by the actor.
        rollout_log_prob: `[B, T]` log-probs the rollout engine reported for the same steps.
    Returns:
        ISDiagnostics (see its fields); ESS = (Σ_b w_b)² / (B·Σ_b w_b²) (Kish's effective sample
        size, normalised by B).
    Raises:
        ValueError: shapes differ or are not [B, T] with B, T ≥ 1; NaN/inf log-probs (indices named).
    """
    log_ratio = _log_ratio(log_prob, rollout_log_prob)
    seq_log_is = log_ratio.sum(dim=1)
    relative = torch.exp(seq_log_is - seq_log_is.max())
    ess = relative.sum() ** 2 / (seq_log_is.numel() * (relative**2).sum())
    return ISDiagnostics(seq_log_is=seq_log_is.float(), mean_log_ratio=float(log_ratio.mean()),
                         is_weight_mean=float(torch.exp(seq_log_is).mean()), ess=float(ess),
                         max_abs_log_ratio=float(log_ratio.abs().max()))


def per_step_abs_log_ratio(log_prob: Tensor, rollout_log_prob: Tensor) -> Tensor:
    """|Δ log_prob| per trained step: mean over samples of |log_prob − rollout_log_prob|, `[T]` float32.

    The rollout-vs-actor log-prob mismatch by denoising step (0 when both engines compute the
    same transition density; bf16 kernels or batch-dependent ops show up here first).

    Args:
        log_prob: `[B, T]` the actor's log-probs of the trained steps; rollout_log_prob: `[B, T]`
            the rollout engine's for the same transitions.
    Returns:
        `[T]` float32 ≥ 0, detached (computed in float64).
    Raises:
        ValueError: shapes differ or are not [B, T] with B, T ≥ 1, or a log-prob is NaN/inf.
    """
    return _log_ratio(log_prob, rollout_log_prob).abs().mean(dim=0).float()


def _check_band(band: tuple[float, float]) -> tuple[float, float]:
    lo, hi = (float(b) for b in band)
    if not (0.0 < lo < 1.0 < hi):
        raise ValueError(f"band=(lo, hi) must satisfy 0 < lo < 1 < hi (e.g. (0.5, 2.0)), got {band!r}")
    return lo, hi


def rs_mask(seq_log_is: Tensor, band: tuple[float, float]) -> Tensor:
    """RS mask: True (keep) where the sequence IS weight exp(seq_log_is) lies in [lo, hi].

    Compared in log space, inclusive: log lo ≤ seq_log_is ≤ log hi, with log lo and log hi
    rounded to float32 like `seq_log_is`, so seq_log_is = log(hi) computed in float32 is kept.
    ±inf weights are rejected.

    Args:
        seq_log_is: `[B]` sequence-level log IS weights (`ISDiagnostics.seq_log_is`).
        band: (lo, hi) with 0 < lo < 1 < hi, e.g. (0.5, 2.0) or `auto_band(...)`.
    Returns:
        `[B]` bool, True = keep (pass as `sample_weight` to `flow_grpo_loss`).
    Raises:
        ValueError: bad band, bad shape, or NaN in seq_log_is (indices named).
    """
    lo, hi = _check_band(band)
    seq_log_is = _finite_seq_log_is(seq_log_is, allow_inf=True)
    bounds = torch.log(torch.tensor([lo, hi], dtype=torch.float32, device=seq_log_is.device))
    return (seq_log_is >= bounds[0]) & (seq_log_is <= bounds[1])


def auto_band(seq_log_is: Tensor, quantile: float = 0.99,
              min_width: float = DEFAULT_MIN_HALF_WIDTH) -> tuple[float, float]:
    """An RS band calibrated from the observed log IS weights.

    Rule: h = max(quantile_q(|seq_log_is|), min_width), band = (exp(−h), exp(h)) — symmetric in
    log space, so it keeps every sample whose |log w| is within the q-quantile of the batch
    (rejecting roughly the (1 − q) most off-policy samples), and is never narrower than
    [exp(−min_width), exp(min_width)] (default [1/2, 2]) so a near-on-policy batch rejects
    nothing for noise-level drift. Quantile uses linear interpolation (`torch.quantile`).

    Args:
        seq_log_is: `[B]` finite sequence-level log IS weights.
        quantile: q ∈ (0, 1].
        min_width: minimum half-width of the band in natural-log space, > 0.
    Returns:
        (lo, hi) with 0 < lo < 1 < hi.
    Raises:
        ValueError: quantile outside (0, 1], min_width ≤ 0, bad shape, non-finite values, or a
            half-width beyond 700 (exp would overflow).
    """
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"quantile must be in (0, 1], got {quantile!r}")
    if not (min_width > 0.0 and math.isfinite(min_width)):
        raise ValueError(f"min_width (minimum log half-width) must be finite and > 0, got {min_width!r}")
    seq_log_is = _finite_seq_log_is(seq_log_is, allow_inf=False)
    half_width = max(float(torch.quantile(seq_log_is.double().abs(), quantile)), float(min_width))
    if half_width > _MAX_HALF_WIDTH:
        raise ValueError(f"auto_band: the {quantile} quantile of |seq_log_is| is {half_width:.3g}, beyond "
                         f"{_MAX_HALF_WIDTH} (exp overflows): trainer and rollout log-probs disagree wildly; "
                         "check the log-prob pipeline (sigmas, dtype, velocity sign)")
    return math.exp(-half_width), math.exp(half_width)
