"""Advantage Weighted Matching (AWM): the pretraining flow-matching loss, weighted by the advantage.

Reference: Xue et al., "Advantage Weighted Matching: Aligning RL with Pretraining in Diffusion
Models" (arXiv 2509.25050), authors' code github.com/scxue/advantage_weighted_matching (SD3.5
OCR config). Like DiffusionNFT it trains on the forward process: a rollout contributes only its
clean x0, its prompt and its advantage, so any sampler (ODE here) works and no rollout log-prob
is needed — immune to rollout/training log-prob drift.

- Re-noise x0 at σ with ε: x_σ = (1−σ)·x0 + σ·ε; the matching error of one draw is
  ℓ = mean_i (v_θ(x_σ, σ) − (ε − x0))²  (the flow-matching loss, `matching_error`).
- A weighting w(ℓ, σ) (`weighted_matching`; the paper's default is the generalised Huber
  σ/p·((ℓ+δ)^p − δ^p), p = 0.25) turns it into the surrogate log-likelihood log p = −w(ℓ, σ).
- Policy loss: PPO's pessimistic clip on ratio = exp(log p − log p_old) per (sample, draw),
  −A·ratio; on-policy (ratio 1) its gradient is A·∇w: the FM loss weighted by the advantage —
  lowered for good samples, raised for bad ones.
- A = clamp(A_group, ±c)·A_max/c (`awm_advantages`; paper: c = 5, A_max = 1).
- Anchors: β_ref·mean (v_θ − v_ref)² to the base model and β_ema·mean (v_θ − v_ema)² to an EMA
  copy refreshed with decay min(0.3, 0.001·steps) (`omnirl.algorithms.old_policy_decay`).

Implementation details: errors are means over latent elements (as the reference code); the
reference code computes ℓ in float64, this module in float32 (the ratio is exactly 1 on-policy
either way: both sides come from the same forward). σ draws are stratified (`grid_indices`,
`stratified_sigmas`) so a sample's draws cover the schedule. Everything is float32.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from omnirl.algorithms._tensors import batch_tensor, f32, per_sample, require, same_shape
from omnirl.algorithms.flow_grpo import flow_grpo_loss
from omnirl.algorithms.modalities import Modalities, weighted_mean

WEIGHTINGS = ("uniform", "t", "t2", "huber", "ghuber")
HUBER_DELTA = 1e-10
"""δ of the Huber weightings: keeps ∂w/∂ℓ finite at ℓ = 0 (as in the reference code)."""


class AWMLoss(NamedTuple):
    """Result of `awm_loss`.

    Attributes:
        loss: 0-dim float32, differentiable: policy_loss + kl_coef·kl + ema_kl_coef·ema_kl.
        policy_loss: 0-dim detached, the clipped surrogate −A·ratio.
        kl: 0-dim detached, mean (v_θ − v_ref)² over (sample, draw) (0 without kl_ref).
        ema_kl: 0-dim detached, mean (v_θ − v_ema)² (0 without kl_ema).
        clip_fraction: 0-dim detached, fraction of entries with |ratio − 1| > ε.
        ratio_max_abs_dev: 0-dim detached, max |ratio − 1|.
    """

    loss: Tensor
    policy_loss: Tensor
    kl: Tensor
    ema_kl: Tensor
    clip_fraction: Tensor
    ratio_max_abs_dev: Tensor


def awm_advantages(advantages: Tensor, clip: float = 5.0, advantage_max: float = 1.0) -> Tensor:
    """A' = clamp(A, −c, c)·A_max/c: group advantages rescaled to [−A_max, A_max] (AWM code).

    Args:
        advantages: `[B]` group-relative advantages (cast to float32).
        clip: c > 0, the advantage clamp (`spec.algorithm.advantage.clip`, 5).
        advantage_max: A_max > 0 (paper: 1).
    Returns:
        `[B]` float32; e.g. c = 5, A_max = 1: [−7, −2.5, 0, 5] → [−1, −0.5, 0, 1].
    Raises:
        ValueError: clip or advantage_max not finite and > 0; TypeError: non-floating advantages.
    """
    for name, value in (("clip", clip), ("advantage_max", advantage_max)):
        if not (value > 0.0 and math.isfinite(value)):
            raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    advantages = f32(advantages, "advantages")
    return advantages.clamp(-clip, clip) * (advantage_max / clip)


def matching_error(v_theta: Tensor, x0: Tensor, eps: Tensor, modalities: Modalities | None = None) -> Tensor:
    """ℓ_b = mean_i (v_θ − (ε − x0))²: the flow-matching error of each sample (x_σ = (1−σ)x0 + σε); with
    `modalities` (a flat multi-modal latent) Σ_m w_m · mean_{i∈m} (…)² (docs/omni.md, "Joint training").

    Args:
        v_theta: `[B, ...]` predicted velocity at x_σ (differentiable).
        x0: `[B, ...]` clean latents; eps: `[B, ...]` the noise x_σ was made with.
        modalities: the modalities and their weights (`algorithms.modalities`); None = one modality.
    Returns:
        `[B]` float32 ≥ 0.
    Raises:
        ValueError: shapes differ.
    """
    v_theta = batch_tensor(v_theta, "v_theta")
    x0, eps = batch_tensor(x0, "x0"), batch_tensor(eps, "eps")
    same_shape(v_theta, x0, "v_theta", "x0")
    same_shape(eps, x0, "eps", "x0")
    diff = v_theta - (eps - x0).detach()
    if modalities is None:
        return diff.pow(2).flatten(1).mean(dim=1)
    return weighted_mean(diff.pow(2), modalities)


def weighted_matching(error: Tensor, sigma: Tensor, weighting: str = "ghuber", power: float = 0.25) -> Tensor:
    """w(ℓ, σ): the AWM time/robustness weighting of the matching error; log p = −w.

    uniform: ℓ; t: σ·ℓ; t2: σ²·ℓ; huber: σ·(√(ℓ+δ) − δ); ghuber: σ/p·((ℓ+δ)^p − δ^p), δ = 1e-10
    (arXiv 2509.25050 code; `huber` subtracts δ, not √δ, as the reference code does).

    Args:
        error: `[B]` matching errors ℓ ≥ 0 (`matching_error`).
        sigma: `[B]` (or a scalar) noise levels in [0, 1].
        weighting: one of `WEIGHTINGS`.
        power: p ∈ (0, 1] for ghuber.
    Returns:
        `[B]` float32 (differentiable through `error`).
    Raises:
        ValueError: unknown weighting, power outside (0, 1], negative errors or σ outside [0, 1].
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    if not 0.0 < power <= 1.0:
        raise ValueError(f"power must be in (0, 1], got {power!r}")
    error = f32(error, "error")
    if error.dim() != 1:
        raise ValueError(f"error must have shape [B], got {tuple(error.shape)}")
    sigma = per_sample(sigma, error.shape[0], "sigma", error)
    require((sigma >= 0) & (sigma <= 1), "sigma must lie in [0, 1]", lambda: f"got {sigma.tolist()}")
    require(error.detach() >= 0, "error must be >= 0 (a mean of squares)", lambda: f"got {error.tolist()}")
    if weighting == "uniform":
        return error
    if weighting == "t":
        return sigma * error
    if weighting == "t2":
        return sigma.pow(2) * error
    if weighting == "huber":
        return sigma * ((error + HUBER_DELTA).sqrt() - HUBER_DELTA)
    return sigma / power * ((error + HUBER_DELTA).pow(power) - HUBER_DELTA**power)


def awm_loss(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, clip_range: float,
             kl: Tensor | None = None, kl_coef: float = 0.0, ema_kl: Tensor | None = None,
             ema_kl_coef: float = 0.0) -> AWMLoss:
    """AWM loss over (sample, draw) entries (arXiv 2509.25050).

    ratio_bk = exp(log_prob_bk − old_log_prob_bk), log_prob = −w(ℓ, σ);
    policy_loss = mean_bk max(−A_b·ratio_bk, −A_b·clip(ratio_bk, 1 ± ε))  (`flow_grpo_loss`);
    loss = policy_loss + kl_coef·mean(kl) + ema_kl_coef·mean(ema_kl).

    Args:
        log_prob: `[B, K]` −w(ℓ, σ) of K draws per sample (differentiable).
        old_log_prob: `[B, K]` the same under the policy before this batch's updates (detached).
        advantages: `[B]` rescaled advantages (`awm_advantages`).
        clip_range: ε > 0 (paper: 1, i.e. effectively off).
        kl: optional `[B, K]` mean_i (v_θ − v_ref)² per draw; kl_coef ≥ 0 (paper: 0.003).
        ema_kl: optional `[B, K]` mean_i (v_θ − v_ema)² per draw; ema_kl_coef ≥ 0 (paper: 1).
    Returns:
        AWMLoss (loss differentiable; the rest detached 0-dim float32).
    Raises:
        ValueError: bad shapes, clip_range ≤ 0, a negative coefficient, or a coefficient > 0
            without its term.
    """
    terms = {}
    for name, term, coef in (("kl", kl, kl_coef), ("ema_kl", ema_kl, ema_kl_coef)):
        if not coef >= 0.0:
            raise ValueError(f"{name}_coef must be >= 0, got {coef!r}")
        if coef > 0.0 and term is None:
            raise ValueError(f"{name}_coef={coef} > 0 needs {name} [B, K]; pass it or set the coefficient to 0")
        if term is not None:
            term = f32(term, name)
            same_shape(term, log_prob, name, "log_prob")
        terms[name] = (term, coef)
    out = flow_grpo_loss(log_prob, old_log_prob, advantages, clip_range)
    loss = out.loss
    means = {}
    for name, (term, coef) in terms.items():
        mean = term.mean() if term is not None else torch.zeros_like(out.policy_loss)
        if coef > 0.0:
            loss = loss + coef * mean
        means[name] = mean.detach()
    return AWMLoss(loss=loss, policy_loss=out.policy_loss, kl=means["kl"], ema_kl=means["ema_kl"],
                   clip_fraction=out.clip_fraction, ratio_max_abs_dev=out.ratio_max_abs_dev)


def _strata(n_draws: int, u: Tensor) -> Tensor:
    """The stratum numbers k = 0 … K−1 `[K]` float64 after checking `u`: `[K]` uniforms in [0, 1), K ≥ 1.

    Raises:
        ValueError: K < 1, u of the wrong shape or outside [0, 1).
    """
    if n_draws < 1 or tuple(u.shape) != (n_draws,):
        raise ValueError(f"u must have shape [{n_draws}] with n_draws >= 1, got {tuple(u.shape)}")
    if not bool(((u >= 0) & (u < 1)).all()):
        raise ValueError(f"u must lie in [0, 1), got {u.tolist()}")
    return torch.arange(n_draws, dtype=torch.float64)


def grid_indices(num_steps: int, fraction: float, n_draws: int, u: Tensor) -> Tensor:
    """Stratified σ-grid step indices (the AWM code's `discrete_wo_init`).

    The trainable steps are [1, n) with n = ⌊num_steps·fraction⌋ (step 0, σ = 1, and the nearly
    clean tail are skipped); draw k takes stratum [k/K, (k+1)/K) of them:
    index_k = 1 + ⌊(k + u_k)/K · (n − 1)⌋.

    Args:
        num_steps: rollout steps N ≥ 2 (the grid has N + 1 σ values).
        fraction: in (0, 1]; n = ⌊N·fraction⌋ must be ≥ 2.
        n_draws: K ≥ 1.
        u: `[K]` uniforms in [0, 1).
    Returns:
        `[K]` int64 indices into the σ grid, non-decreasing, in [1, n − 1].
    Raises:
        ValueError: n < 2, K < 1, or u of the wrong shape or outside [0, 1).
    """
    n = int(num_steps * fraction)
    if n < 2:
        raise ValueError(f"floor(num_steps·fraction) = floor({num_steps}·{fraction}) = {n}; need >= 2 trainable steps")
    k = _strata(n_draws, u)
    return 1 + torch.floor((k + u.double()) / n_draws * (n - 1)).long()


def stratified_sigmas(sigma_range: tuple[float, float], n_draws: int, u: Tensor) -> Tensor:
    """σ_k = lo + (k + u_k)/K·(hi − lo): one uniform σ per stratum of [lo, hi].

    Args:
        sigma_range: (lo, hi) with 0 ≤ lo < hi ≤ 1.
        n_draws: K ≥ 1; u: `[K]` uniforms in [0, 1).
    Returns:
        `[K]` float32, increasing.
    Raises:
        ValueError: bad range, or u of the wrong shape or outside [0, 1).
    """
    lo, hi = (float(v) for v in sigma_range)
    if not 0.0 <= lo < hi <= 1.0:
        raise ValueError(f"sigma_range must satisfy 0 <= lo < hi <= 1, got {sigma_range!r}")
    k = _strata(n_draws, u)
    return (lo + (k + u.double()) / n_draws * (hi - lo)).float()
