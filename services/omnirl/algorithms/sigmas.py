"""The σ grid of a flow-matching sampler, with SD3's timestep shift.

Reference: Esser et al., "Scaling Rectified Flow Transformers for High-Resolution Image
Synthesis" (SD3, arXiv 2403.03206), §5.3.2 "resolution-dependent shifting of timestep
schedules": σ' = shift·σ / (1 + (shift − 1)·σ). diffusers' `FlowMatchEulerDiscreteScheduler`
applies the same rule.

Convention (docs/architecture.md §4): σ runs from 1 (pure noise) to 0 (data); the grid is stored as σ
values, never as rounded integer timesteps.
"""

from __future__ import annotations

import torch
from torch import Tensor


def sigma_schedule(num_steps: int, shift: float = 1.0) -> Tensor:
    """The σ grid of `num_steps` denoising steps, from 1.0 to 0.0.

    σ_k = 1 − k/num_steps (k = 0 … num_steps), then σ'_k = shift·σ_k / (1 + (shift − 1)·σ_k)
    (SD3, arXiv 2403.03206 §5.3.2). shift > 1 spends more steps at high noise. The end points are
    exactly 1.0 and 0.0 for every shift; the grid is strictly decreasing. Computed in float64 and
    returned as float32.

    Args:
        num_steps: number of denoising steps N (≥ 1). Step i goes from σ_i to σ_{i+1}.
        shift: SD3 timestep shift (> 0); 1.0 = no shift (SD3.5 uses 3.0).
    Returns:
        `[num_steps + 1]` float32, σ_0 = 1.0 > σ_1 > … > σ_N = 0.0.
    Raises:
        ValueError: num_steps < 1 or shift ≤ 0 (or not finite).
    """
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be an int >= 1, got {num_steps!r}")
    shift = float(shift)
    if not (shift > 0.0 and shift < float("inf")):
        raise ValueError(f"shift must be a finite number > 0, got {shift!r}")
    sigma = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
    shifted = shift * sigma / (1.0 + (shift - 1.0) * sigma)
    shifted[0], shifted[-1] = 1.0, 0.0  # exact end points whatever the rounding
    return shifted.float()
