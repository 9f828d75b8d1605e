"""One denoising step of a flow-matching sampler: ODE (Euler), Flow-GRPO SDE and CPS.

References:
- Flow-GRPO: Liu et al., "Flow-GRPO: Training Flow Matching Models via Online RL"
  (arXiv 2505.05470), "ODE-to-SDE conversion": the reverse SDE with the flow ODE's marginals,
  dx = [v + s²/(2σ)·(x + (1−σ)v)] dσ + s·dw with s = a·sqrt(σ/(1−σ)), discretised by
  Euler–Maruyama; log π(x_next | x) is Gaussian.
- CPS: "Coefficients-Preserving Sampling for Reinforcement Learning with Flow Matching"
  (arXiv 2509.05952): a DDIM-like step whose x_next keeps the signal/noise coefficients
  (1 − σ_next, σ_next) of the flow; reference code in github.com/yifan123/flow_grpo (sde_type "cps").

Convention (docs/architecture.md §4): σ from 1 (noise) to 0 (data), x_σ = (1−σ)x0 + σε, v = ε − x0,
dt = σ_next − σ < 0. Every function computes in float32: bf16/fp16 inputs are cast in (the SDE
step, latents and log-probs must stay fp32 or the on-policy ratio drifts from 1).

Implementation details:
- σ = 1 (first step): s = a·sqrt(σ/(1−σ)) divides by zero; as in Flow-GRPO's reference code
  the σ in the denominator is replaced by the next grid value, s = a·sqrt(1/(1−σ_next)).
- The drift coefficient s²/(2σ) is evaluated as a²/(2(1−σ̃)) (σ̃ = σ_next at σ = 1, else σ),
  which is the same number without a division by σ, so σ → 0 is harmless.
- CPS: sqrt(σ_next² − std²) is evaluated as σ_next·cos(aπ/2) (exact identity), which cannot go
  negative by rounding; at σ_next = 0 (the last step) its std is 0.
- noise_level 0 returns the ODE mean bit for bit and std 0 (both types).
- The log-prob is the full Gaussian log-density (constants included) averaged — not summed —
  over latent elements, which is why Flow-GRPO's clip ranges are ~1e-4.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from omnirl.algorithms._tensors import batch_tensor, bcast, per_sample, positive_std, require, same_shape
from omnirl.algorithms.modalities import trained_mean

SDE_TYPES = ("sde", "cps")
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class SDEStep(NamedTuple):
    """Result of `sde_step`.

    Attributes:
        x_next: `[B, ...]` float32, the sample at σ_next.
        mean: `[B, ...]` float32, mean of π(x_next | x).
        std: `[B]` float32, per-sample standard deviation of π(x_next | x) (0 = deterministic).
        log_prob: `[B]` float32, log π(x_next | x) averaged over elements (0 where std = 0).
    """

    x_next: Tensor
    mean: Tensor
    std: Tensor
    log_prob: Tensor


def _check_step(x: Tensor, v: Tensor, sigma, sigma_next) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Cast to float32, check shapes and 0 ≤ σ_next < σ ≤ 1; return x, v, σ [B], σ_next [B]."""
    x = batch_tensor(x, "x")
    v = batch_tensor(v, "v")
    same_shape(x, v, "x", "v")
    sigma = per_sample(sigma, x.shape[0], "sigma", x)
    sigma_next = per_sample(sigma_next, x.shape[0], "sigma_next", x)
    ok = (sigma_next >= 0) & (sigma_next < sigma) & (sigma <= 1)

    def where() -> str:
        bad = (~ok).nonzero().flatten().tolist()
        return f"violated at indices {bad} (sigma={sigma[bad].tolist()}, sigma_next={sigma_next[bad].tolist()})"

    require(ok, "need 0 <= sigma_next < sigma <= 1 per sample", where)
    return x, v, sigma, sigma_next


def ode_step(x: Tensor, v: Tensor, sigma: Tensor, sigma_next: Tensor) -> Tensor:
    """Euler step of the flow ODE: x_next = x + v·(σ_next − σ).

    Args:
        x: latents at σ, `[B, ...]` (cast to float32).
        v: velocity ε − x0 predicted at (x, σ), same shape as x.
        sigma, sigma_next: `[B]` (or scalars), 0 ≤ σ_next < σ ≤ 1.
    Returns:
        `[B, ...]` float32.
    Raises:
        ValueError / TypeError: shapes, dtypes or σ ordering are wrong.
    """
    x, v, sigma, sigma_next = _check_step(x, v, sigma, sigma_next)
    return x + v * bcast(sigma_next - sigma, x)


def sde_mean_std(x: Tensor, v: Tensor, sigma: Tensor, sigma_next: Tensor, noise_level: float,
                 sde_type: str = "sde") -> tuple[Tensor, Tensor]:
    """Mean and std of the Gaussian transition π(x_next | x) of one stochastic step.

    "sde" (Flow-GRPO, arXiv 2505.05470, Euler–Maruyama step of its SDE), dt = σ_next − σ:
        s = a·sqrt(σ/(1−σ))  (at σ = 1 the denominator uses σ_next: s = a·sqrt(1/(1−σ_next)))
        mean = x·(1 + s²·dt/(2σ)) + v·(1 + s²·(1−σ)/(2σ))·dt,   std = s·sqrt(−dt)
    "cps" (arXiv 2509.05952):
        std = σ_next·sin(aπ/2);  x̂0 = x − σv;  x̂1 = x + (1−σ)v
        mean = x̂0·(1−σ_next) + x̂1·sqrt(σ_next² − std²)   (= x̂1·σ_next·cos(aπ/2))

    Edge cases: σ = 1 handled as above; σ → 0 is finite (no division by σ); σ_next = 0 gives
    std 0 for "cps" (and std = s·sqrt(σ) > 0 for "sde"). noise_level 0 returns exactly
    `ode_step(x, v, sigma, sigma_next)` and std 0.

    Args:
        x, v: `[B, ...]`, cast to float32. v = ε − x0 at (x, σ).
        sigma, sigma_next: `[B]` (or scalars), 0 ≤ σ_next < σ ≤ 1.
        noise_level: a ≥ 0 (Flow-GRPO default 0.7; CPS default 0.8, must be ≤ 1).
        sde_type: "sde" or "cps".
    Returns:
        (mean `[B, ...]` float32, std `[B]` float32).
    Raises:
        ValueError: unknown sde_type, negative noise_level (or > 1 for "cps"), bad σ or shapes.
    """
    if sde_type not in SDE_TYPES:
        raise ValueError(f"sde_type must be one of {SDE_TYPES}, got {sde_type!r}")
    a = float(noise_level)
    if not (0.0 <= a < float("inf")) or (sde_type == "cps" and a > 1.0):
        limit = "[0, 1] for sde_type='cps'" if sde_type == "cps" else "finite and >= 0"
        raise ValueError(f"noise_level must be {limit}, got {noise_level!r}")
    x, v, sigma, sigma_next = _check_step(x, v, sigma, sigma_next)
    dt = sigma_next - sigma
    if a == 0.0:
        return x + v * bcast(dt, x), torch.zeros_like(sigma)
    if sde_type == "sde":
        sigma_den = torch.where(sigma == 1.0, sigma_next, sigma)  # σ̃: avoids 1/(1−1) at σ = 1
        s = a * torch.sqrt(sigma / (1.0 - sigma_den))
        half_s2_over_sigma = (a * a) / (2.0 * (1.0 - sigma_den))  # s²/(2σ) without dividing by σ
        k = bcast(half_s2_over_sigma, x)
        mean = x * (1.0 + k * bcast(dt, x)) + v * (1.0 + k * bcast(1.0 - sigma, x)) * bcast(dt, x)
        return mean, s * torch.sqrt(-dt)
    std = sigma_next * math.sin(a * math.pi / 2.0)
    x0_hat = x - bcast(sigma, x) * v
    x1_hat = x + bcast(1.0 - sigma, x) * v
    noise_coef = sigma_next * math.cos(a * math.pi / 2.0)  # sqrt(σ_next² − std²)
    mean = x0_hat * bcast(1.0 - sigma_next, x) + x1_hat * bcast(noise_coef, x)
    return mean, std


def gaussian_log_prob(x_next: Tensor, mean: Tensor, std: Tensor, mask: Tensor | None = None) -> Tensor:
    """Per-sample Gaussian log-density, averaged (not summed) over elements.

    log_prob_b = mean_i [ −(x_next − mean)²/(2·std_b²) − log std_b − ½·log 2π ]
    (Flow-GRPO, arXiv 2505.05470: log-probs are per-element means, hence tiny clip ranges).
    Differentiable w.r.t. `mean` (the training recompute); pass a stored/detached `x_next`.

    With `mask` (a multi-modal latent with a modality left out of the policy) the mean runs over the
    masked (trained) elements only: (Σ_m D_m · log_prob_m) / Σ_m D_m over the trained modalities m
    (`modalities.trained_mean`; docs/omni.md, "Joint training").

    Args:
        x_next: `[B, ...]`, cast to float32.
        mean: same shape as x_next.
        std: `[B]` (or a scalar), every entry > 0.
        mask: optional bool of one sample's latent shape (`[D]` for a flat latent): the trained elements.
    Returns:
        `[B]` float32.
    Raises:
        ValueError: shapes differ or some std ≤ 0 (the density is undefined there; `sde_step`
            handles std = 0 itself).
    """
    x_next = batch_tensor(x_next, "x_next")
    mean = batch_tensor(mean, "mean")
    same_shape(x_next, mean, "x_next", "mean")
    std = positive_std(std, x_next.shape[0], x_next, "a log-density")
    z2 = trained_mean((x_next - mean) ** 2, mask)
    return -z2 / (2.0 * std**2) - torch.log(std) - _HALF_LOG_2PI


def sde_step(x: Tensor, v: Tensor, sigma: Tensor, sigma_next: Tensor, noise_level: float,
             sde_type: str = "sde", noise: Tensor | None = None,
             generator: torch.Generator | None = None, mask: Tensor | None = None) -> SDEStep:
    """Sample x_next ~ π(x_next | x) = N(mean, std²) and return its log-prob (see `sde_mean_std`).

    x_next = mean + std·ε. When `noise` is None, ε ~ N(0, I) is drawn with `generator` on x's
    device (always drawn, even when std = 0, so the generator advances the same way whatever
    the noise level). Where std = 0 (noise_level 0, or CPS at σ_next = 0) the step is
    deterministic: x_next = mean exactly and log_prob is undefined, so it is returned as 0 —
    such a step must not be trained.

    With `mask` (bool of one sample's latent shape: the trained elements of a multi-modal latent) the
    elements outside it take the deterministic ODE update x + v·(σ_next − σ) (a modality sampled but not
    trained, docs/omni.md) and the log-prob averages over the masked elements only (`gaussian_log_prob`).

    Args:
        x, v: `[B, ...]` (cast to float32); sigma, sigma_next: `[B]` (or scalars).
        noise_level: a ≥ 0; sde_type: "sde" or "cps".
        noise: optional `[B, ...]` standard-normal noise (cast to float32).
        generator: torch.Generator for drawing noise (its device must match x).
        mask: optional bool `[...]` of one sample's shape; None = every element stochastic and in the log-prob.
    Returns:
        SDEStep(x_next [B, ...], mean [B, ...], std [B], log_prob [B]), all float32; log_prob
        uses x_next detached.
    Raises:
        ValueError: as `sde_mean_std`, or noise's shape differs from x's.
    """
    mean, std = sde_mean_std(x, v, sigma, sigma_next, noise_level, sde_type)
    if noise is None:
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=torch.float32)
    else:
        noise = batch_tensor(noise, "noise")
        same_shape(noise, mean, "noise", "x")
    x_next = mean + bcast(std, mean) * noise
    if mask is not None:  # the untrained modality's elements take the ODE update
        x_next = torch.where(mask.to(x_next.device), x_next, ode_step(x, v, sigma, sigma_next))
    stochastic = std > 0
    safe_std = torch.where(stochastic, std, torch.ones_like(std))
    log_prob = gaussian_log_prob(x_next.detach(), mean, safe_std, mask)
    log_prob = torch.where(stochastic, log_prob, torch.zeros_like(log_prob))
    return SDEStep(x_next=x_next, mean=mean, std=std, log_prob=log_prob)
