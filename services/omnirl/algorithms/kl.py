"""Closed-form KL between the current and reference SDE transitions (Flow-GRPO's KL term).

Reference: Flow-GRPO (arXiv 2505.05470), KL regulariser: both policies' one-step transitions
π(x_next | x) are Gaussians with the same isotropic std s (it depends only on σ, σ_next and the
noise level), so KL(N(μ, s²I) ‖ N(μ_ref, s²I)) = ‖μ − μ_ref‖²/(2s²) per element. As with the
log-prob, it is averaged (not summed) over elements. The reference is the base model (LoRA
disabled); β = 0.04 (OCR, GenEval), 0.01 (PickScore), 0 in no-CFG fast recipes.
"""

from __future__ import annotations

from torch import Tensor

from omnirl.algorithms._tensors import batch_tensor, positive_std, same_shape
from omnirl.algorithms.modalities import trained_mean


def gaussian_kl(mean: Tensor, mean_ref: Tensor, std: Tensor, mask: Tensor | None = None) -> Tensor:
    """KL of two Gaussians with equal isotropic std, averaged over elements.

    kl_b = mean_i (mean_bi − mean_ref_bi)² / (2·std_b²)   (Flow-GRPO, arXiv 2505.05470).
    Differentiable w.r.t. `mean` (and `mean_ref` if it requires grad; normally detached).

    Args:
        mean: `[B, ...]` current-policy transition mean (cast to float32).
        mean_ref: same shape, reference-policy transition mean.
        std: `[B]` (or a scalar) shared std, every entry > 0.
        mask: optional bool of one sample's latent shape: average over the trained elements only (as
            `sde.gaussian_log_prob`).
    Returns:
        `[B]` float32, ≥ 0, exactly 0 where the means are equal.
    Raises:
        ValueError: shapes differ, or some std ≤ 0 (a deterministic step has no KL: don't train it).
    """
    mean = batch_tensor(mean, "mean")
    mean_ref = batch_tensor(mean_ref, "mean_ref")
    same_shape(mean, mean_ref, "mean", "mean_ref")
    std = positive_std(std, mean.shape[0], mean, "the Gaussian KL")
    return trained_mean((mean - mean_ref) ** 2, mask) / (2.0 * std**2)
