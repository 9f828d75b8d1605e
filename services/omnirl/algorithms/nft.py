"""DiffusionNFT: online RL on the forward (noising) process, without likelihoods.

Reference: Zheng et al., "DiffusionNFT: Online Diffusion Reinforcement with Forward Process"
(arXiv 2509.16117), reference code github.com/NVlabs/DiffusionNFT. Only the clean x0 of a
rollout and its reward are needed; the rollout uses any deterministic solver on v_old.

- Optimality probability r = clamp(A/(2·A_max) + 0.5, 0, 1), A_max = 5.
- Implicit policies: v⁺ = β·v_θ + (1−β)·v_old (positive), v⁻ = (1+β)·v_old − β·v_θ (negative).
- Re-noise x0 with fresh ε: x_t = (1−σ)x0 + σε; x̂0(v) = x_t − σ·v.
- Loss: r·‖x̂0(v⁺) − x0‖²/w⁺ + (1−r)·‖x̂0(v⁻) − x0‖²/w⁻ with the adaptive weight
  w = stop-grad(mean |x̂0 − x0|) per sample and branch, clamped to ≥ 1e-5.
- v_old is a second adapter refreshed every k optimiser steps: copy early, then an EMA whose
  decay ramps toward 0.999 (`old_policy_decay`, `ema_update_`).

Implementation details: squared errors are means over elements (not sums), as in the reference
code. The reference code also multiplies the loss by A_max/β; `nft_loss` does not (that constant
matters only through gradient clipping and Adam's ε: fold it into the learning rate or the clip
norm). v_old is detached inside. Everything is float32.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

import torch
from torch import Tensor

from omnirl.algorithms._tensors import batch_tensor, bcast, element_mean, f32, per_sample, same_shape
from omnirl.algorithms.modalities import Modalities, modality_means

ADAPTIVE_WEIGHT_MIN = 1e-5
DECAY_SCHEDULES = ("copy", "ema")


class NFTLoss(NamedTuple):
    """Result of `nft_loss`.

    Attributes:
        loss: 0-dim float32, differentiable w.r.t. v_θ.
        positive_loss: 0-dim detached, mean_B r·err⁺/w⁺.
        negative_loss: 0-dim detached, mean_B (1−r)·err⁻/w⁻.
    """

    loss: Tensor
    positive_loss: Tensor
    negative_loss: Tensor


def optimality_probability(advantages: Tensor, advantage_max: float = 5.0) -> Tensor:
    """r = clamp(A/(2·A_max) + 0.5, 0, 1) (DiffusionNFT, arXiv 2509.16117).

    Args:
        advantages: `[B]` (cast to float32).
        advantage_max: A_max > 0, the advantage clip (5 in Flow-GRPO/DiffusionNFT).
    Returns:
        `[B]` float32 in [0, 1]; A = 0 → 0.5, A ≥ A_max → 1, A ≤ −A_max → 0.
    Raises:
        ValueError: advantage_max ≤ 0; TypeError: non-floating advantages.
    """
    if not (advantage_max > 0.0 and math.isfinite(advantage_max)):
        raise ValueError(f"advantage_max must be finite and > 0, got {advantage_max!r}")
    advantages = f32(advantages, "advantages")
    return (advantages / (2.0 * advantage_max) + 0.5).clamp(0.0, 1.0)


def implicit_velocities(v_theta: Tensor, v_old: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    """Implicit positive / negative velocities (DiffusionNFT, arXiv 2509.16117).

    v⁺ = β·v_θ + (1−β)·v_old,  v⁻ = (1+β)·v_old − β·v_θ  (v_old detached).

    Args:
        v_theta: `[B, ...]` current-policy velocity (differentiable), cast to float32.
        v_old: same shape, old-policy velocity (treated as a constant).
        beta: β > 0 (1.0 GenEval/PickScore, 0.1 OCR).
    Returns:
        (v_plus, v_minus), each `[B, ...]` float32.
    Raises:
        ValueError: shapes differ or beta ≤ 0.
    """
    if not (beta > 0.0 and math.isfinite(beta)):
        raise ValueError(f"beta must be finite and > 0, got {beta!r}")
    v_theta = batch_tensor(v_theta, "v_theta")
    v_old = batch_tensor(v_old, "v_old").detach()
    same_shape(v_theta, v_old, "v_theta", "v_old")
    return beta * v_theta + (1.0 - beta) * v_old, (1.0 + beta) * v_old - beta * v_theta


def _weighted_error(x0_hat: Tensor, x0: Tensor, modalities: Modalities | None = None) -> Tensor:
    """Per-sample mean squared error divided by stop-grad(mean |x̂0 − x0|) clamped ≥ 1e-5; with `modalities`,
    Σ_m w_m · (the same over modality m's elements), each modality its own adaptive weight."""
    diff = x0_hat - x0
    if modalities is None:
        with torch.no_grad():
            weight = element_mean(diff.abs()).clamp_min(ADAPTIVE_WEIGHT_MIN)
        return element_mean(diff**2) / weight
    with torch.no_grad():
        weight = modality_means(diff.abs(), modalities).clamp_min(ADAPTIVE_WEIGHT_MIN)  # [B, M]
    w = torch.tensor(modalities.weights, dtype=diff.dtype, device=diff.device)
    return (modality_means(diff**2, modalities) / weight * w).sum(dim=1)


def nft_loss(x0: Tensor, x_t: Tensor, sigma: Tensor, v_theta: Tensor, v_old: Tensor, r: Tensor,
             beta: float, modalities: Modalities | None = None) -> NFTLoss:
    """DiffusionNFT loss (arXiv 2509.16117), with adaptive weights.

    x̂0(v) = x_t − σ·v;  err(v) = mean_i (x̂0(v) − x0)²;  w(v) = stop-grad(max(mean_i |x̂0(v) − x0|, 1e-5));
    loss = mean_B [ r·err(v⁺)/w(v⁺) + (1−r)·err(v⁻)/w(v⁻) ].
    A multi-modal latent (`modalities`): err/w is taken per modality and summed with the modality weights,
    Σ_m w_m·err_m/w_m (docs/omni.md, "Joint training"); a modality of weight 0 is in no term.

    Args:
        x0: `[B, ...]` clean rollout latents (cast to float32).
        x_t: `[B, ...]` = (1−σ)·x0 + σ·ε with fresh ε.
        sigma: `[B]` (or a scalar) noise level of x_t, in [0, 1].
        v_theta: `[B, ...]` current-policy velocity at (x_t, σ), differentiable.
        v_old: `[B, ...]` old-policy velocity at (x_t, σ) (detached inside).
        r: `[B]` optimality probability in [0, 1] (`optimality_probability`).
        beta: β > 0.
        modalities: the flat latent's modalities and weights (`algorithms.modalities`); None = one modality.
    Returns:
        NFTLoss(loss differentiable 0-dim, positive_loss and negative_loss detached 0-dim).
    Raises:
        ValueError: shapes differ, beta ≤ 0, sigma outside [0, 1] or r outside [0, 1].
    """
    x0 = batch_tensor(x0, "x0")
    x_t = batch_tensor(x_t, "x_t")
    same_shape(x0, x_t, "x0", "x_t")
    sigma = per_sample(sigma, x0.shape[0], "sigma", x0)
    r = per_sample(r, x0.shape[0], "r", x0)
    for name, value in (("sigma", sigma), ("r", r)):
        if not bool(((value >= 0) & (value <= 1)).all()):
            raise ValueError(f"{name} must lie in [0, 1], got {value.tolist()}")
    v_plus, v_minus = implicit_velocities(v_theta, v_old, beta)
    same_shape(v_plus, x0, "v_theta", "x0")
    positive = r * _weighted_error(x_t - bcast(sigma, x_t) * v_plus, x0, modalities)
    negative = (1.0 - r) * _weighted_error(x_t - bcast(sigma, x_t) * v_minus, x0, modalities)
    loss = (positive + negative).mean()
    return NFTLoss(loss=loss, positive_loss=positive.detach().mean(), negative_loss=negative.detach().mean())


def old_policy_decay(optimizer_step: int, schedule: str = "copy", decay_max: float = 0.999,
                     ramp_steps: int = 100) -> float:
    """EMA decay for refreshing the old policy θ_old ← decay·θ_old + (1 − decay)·θ.

    "copy": always 0.0 (θ_old ← θ). "ema": a linear ramp,
    decay = min(decay_max, optimizer_step / ramp_steps · decay_max), so the first refresh
    (step 0) is a copy and the decay reaches decay_max at ramp_steps (DiffusionNFT,
    arXiv 2509.16117: copy early, then an EMA whose decay ramps toward 0.999).

    Args:
        optimizer_step: optimiser steps taken so far (≥ 0).
        schedule: "copy" or "ema".
        decay_max: final decay in [0, 1).
        ramp_steps: steps to reach decay_max (≥ 1).
    Returns:
        decay in [0, decay_max].
    Raises:
        ValueError: unknown schedule or an argument out of range.
    """
    if schedule not in DECAY_SCHEDULES:
        raise ValueError(f"schedule must be one of {DECAY_SCHEDULES}, got {schedule!r}")
    if isinstance(optimizer_step, bool) or not isinstance(optimizer_step, int) or optimizer_step < 0:
        raise ValueError(f"optimizer_step must be an int >= 0, got {optimizer_step!r}")
    if not 0.0 <= decay_max < 1.0:
        raise ValueError(f"decay_max must be in [0, 1), got {decay_max!r}")
    if isinstance(ramp_steps, bool) or not isinstance(ramp_steps, int) or ramp_steps < 1:
        raise ValueError(f"ramp_steps must be an int >= 1, got {ramp_steps!r}")
    if schedule == "copy":
        return 0.0
    return min(decay_max, optimizer_step / ramp_steps * decay_max)


@torch.no_grad()
def ema_update_(old: Iterable[Tensor], new: Iterable[Tensor], decay: float) -> None:
    """In place, old ← decay·old + (1 − decay)·new, tensor by tensor, without autograd.

    decay = 0 copies `new` exactly. Non-float32 tensors (bf16 adapters) are blended in float32
    and written back in their own dtype.

    Args:
        old: the old-policy tensors (parameters), modified in place.
        new: the current-policy tensors, same count, shapes in the same order.
        decay: in [0, 1] (`old_policy_decay`).
    Raises:
        ValueError: decay outside [0, 1], or counts/shapes differ (index named).
    """
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"decay must be in [0, 1], got {decay!r}")
    old, new = list(old), list(new)
    if len(old) != len(new):
        raise ValueError(f"old has {len(old)} tensors but new has {len(new)}: pass matching parameter lists")
    for index, (o, n) in enumerate(zip(old, new, strict=True)):
        if o.shape != n.shape:
            raise ValueError(f"tensor {index}: old shape {tuple(o.shape)} != new shape {tuple(n.shape)}")
        if decay == 0.0:
            o.copy_(n)
        elif o.dtype == torch.float32:
            o.lerp_(n.to(o.device, torch.float32), 1.0 - decay)
        else:
            o.copy_(o.float().lerp(n.to(o.device, torch.float32), 1.0 - decay))
