"""The Flow-GRPO policy loss: PPO's clipped surrogate per (sample, trained step).

Reference: Liu et al., "Flow-GRPO: Training Flow Matching Models via Online RL" (arXiv
2505.05470), GRPO objective; the clipped surrogate is PPO's (Schulman et al., arXiv 1707.06347,
Eq. 7): per entry max(−A·ratio, −A·clip(ratio, 1−ε, 1+ε)) (the negated min of the PPO
objective), ratio = exp(log_prob − old_log_prob), averaged over (sample, trained step) entries,
plus kl_coef × the per-step closed-form KL to the reference policy (`kl.gaussian_kl`).

Implementation details:
- Log-probs are per-element means (see `sde.gaussian_log_prob`), so ratios stay within ~1e-4
  of 1 and clip ranges are tiny (1e-4, or 1e-5 in "fast" recipes).
- old_log_prob, advantages, sample_weight and kl's gradient path are the caller's business:
  old_log_prob and advantages are detached here, kl is used as given (differentiable).
- sample_weight is the rollout-correction RS mask (`rollout_correction.rs_mask`, 0/1): it
  multiplies each sample's terms and the mean runs over entries with weight > 0. With every
  weight 0 the loss is an exact 0 that still has a grad_fn (zero gradients), never NaN.
- Diagnostics are detached 0-dim float32 tensors (no host sync in the training loop; call
  `.item()` when logging): clip_fraction over the kept entries, ratio statistics over all
  entries (policy drift regardless of the RS mask; on-policy they are 1 and 0 to ~1e-6).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from omnirl.algorithms._tensors import f32


class GRPOLoss(NamedTuple):
    """Result of `flow_grpo_loss`.

    Attributes:
        loss: 0-dim float32, differentiable: policy_loss + kl_coef·kl_loss.
        policy_loss: 0-dim detached, the clipped-surrogate part.
        kl_loss: 0-dim detached, mean KL over kept entries (0 when kl is None).
        clip_fraction: 0-dim detached, fraction of kept (sample, step) entries with |ratio − 1| > ε.
        ratio_mean: 0-dim detached, mean ratio over all entries.
        ratio_max_abs_dev: 0-dim detached, max |ratio − 1| over all entries.
    """

    loss: Tensor
    policy_loss: Tensor
    kl_loss: Tensor
    clip_fraction: Tensor
    ratio_mean: Tensor
    ratio_max_abs_dev: Tensor


def _check_shapes(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, kl: Tensor | None,
                  sample_weight: Tensor | None) -> None:
    if log_prob.dim() != 2 or log_prob.shape[0] == 0 or log_prob.shape[1] == 0:
        raise ValueError(f"log_prob must have shape [B, T] with B, T >= 1, got {tuple(log_prob.shape)}")
    batch = log_prob.shape[0]
    named = {"old_log_prob": (old_log_prob, log_prob.shape), "advantages": (advantages, (batch,))}
    if kl is not None:
        named["kl"] = (kl, log_prob.shape)
    if sample_weight is not None:
        named["sample_weight"] = (sample_weight, (batch,))
    for name, (tensor, shape) in named.items():
        if tuple(tensor.shape) != tuple(shape):
            raise ValueError(f"{name} must have shape {list(shape)} to match log_prob [B, T], "
                             f"got {tuple(tensor.shape)}")


def flow_grpo_loss(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, clip_range: float,
                   kl: Tensor | None = None, kl_coef: float = 0.0,
                   sample_weight: Tensor | None = None) -> GRPOLoss:
    """Clipped-surrogate Flow-GRPO loss over (sample, trained step) entries.

    ratio_bt = exp(log_prob_bt − old_log_prob_bt);
    ℓ_bt = max(−A_b·ratio_bt, −A_b·clip(ratio_bt, 1 − ε, 1 + ε))   (PPO, arXiv 1707.06347 Eq. 7);
    policy_loss = Σ_bt w_b·ℓ_bt / (T·#{b: w_b > 0});  kl_loss likewise with kl_bt;
    loss = policy_loss + kl_coef·kl_loss.   (Flow-GRPO, arXiv 2505.05470.)

    Args:
        log_prob: `[B, T]` current-policy log-probs of the T trained steps (differentiable).
        old_log_prob: `[B, T]` behaviour log-probs (recomputed by the actor, or the rollout's
            in bypass mode); detached.
        advantages: `[B]` per trajectory (`advantages.group_advantages`); detached.
        clip_range: ε > 0 (1e-4 … 1e-5 for per-element-mean log-probs).
        kl: optional `[B, T]` per-step KL to the reference (`kl.gaussian_kl`), differentiable.
        kl_coef: β ≥ 0 (0.04 OCR/GenEval, 0.01 PickScore); > 0 requires kl.
        sample_weight: optional `[B]` ≥ 0, the RS mask as 0/1 (bool accepted); None = all 1.
    Returns:
        GRPOLoss (loss differentiable; diagnostics detached 0-dim float32 tensors).
    Raises:
        ValueError: bad shapes, clip_range ≤ 0, kl_coef < 0, kl_coef > 0 without kl, or
            negative sample weights.
    """
    if not clip_range > 0.0:
        raise ValueError(f"clip_range must be > 0, got {clip_range!r}")
    if not kl_coef >= 0.0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef!r}")
    if kl_coef > 0.0 and kl is None:
        raise ValueError(f"kl_coef={kl_coef} > 0 needs the per-step kl [B, T]; pass kl or set kl_coef=0")
    log_prob = f32(log_prob, "log_prob")
    old_log_prob = f32(old_log_prob, "old_log_prob").detach()
    advantages = f32(advantages, "advantages").detach()
    kl = None if kl is None else f32(kl, "kl")
    weight = None if sample_weight is None else sample_weight.to(torch.float32).detach()
    _check_shapes(log_prob, old_log_prob, advantages, kl, weight)
    if weight is None:
        weight = torch.ones_like(advantages)
    elif not bool((weight >= 0).all()):
        raise ValueError(f"sample_weight must be >= 0, got negatives at {(weight < 0).nonzero().flatten().tolist()}")

    ratio = torch.exp(log_prob - old_log_prob)
    adv = advantages[:, None]
    per_entry = torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - clip_range, 1.0 + clip_range))
    kept = (weight > 0).to(torch.float32)
    denominator = (kept.sum() * log_prob.shape[1]).clamp_min(1.0)
    policy_loss = (per_entry * weight[:, None]).sum() / denominator
    kl_loss = (kl * weight[:, None]).sum() / denominator if kl is not None else torch.zeros_like(policy_loss)
    loss = policy_loss + kl_coef * kl_loss if kl is not None else policy_loss

    with torch.no_grad():
        clipped = ((ratio - 1.0).abs() > clip_range).to(torch.float32)
        clip_fraction = (clipped * kept[:, None]).sum() / denominator
        deviation = (ratio - 1.0).abs()
    return GRPOLoss(loss=loss, policy_loss=policy_loss.detach(), kl_loss=kl_loss.detach(),
                    clip_fraction=clip_fraction, ratio_mean=ratio.detach().mean(),
                    ratio_max_abs_dev=deviation.max())
