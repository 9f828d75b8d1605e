"""Direct Group Preference Optimization (DGPO): a DPO likelihood over groups, on the forward process.

Reference: Luo, Hu, Tang, "Reinforcing Diffusion Models by Direct Group Preference Optimization"
(arXiv 2510.08425, ICLR 2026), authors' code github.com/Luo-Yihong/DGPO (`train_sd3_dgpo.py`).
Like AWM it trains on re-noised clean samples, so rollouts use the ODE sampler and need no
log-probs.

- Per draw (σ, ε) of a sample: the matching errors ℓ_θ = mean (v_θ(x_σ) − (ε − x0))² and ℓ_ref
  (the reference model's; `omnirl.algorithms.awm.matching_error`).
- A group g of G samples with advantages A_j is split into a positive and a negative part by the
  sign of A; the implicit group reward difference is −s_g with
  s_g = β/G · Σ_{j∈g} A_j·(ℓ_θ,j − ℓ_ref,j),
  and DGPO maximises log σ(−s_g) (Bradley–Terry on groups, DPO's implicit reward).
- Its gradient is ∇(−log σ(−s_g)) = σ(s_g)·β/G · Σ_j A_j·∇ℓ_θ,j, so the loss used is the
  surrogate mean_j σ(s_g)·A_j·ℓ_θ,j with σ(s_g) detached (`dgpo_loss`; the gradient of
  mean_g −log σ(−s_g) divided by β). `group_nll` reports mean_g −log σ(−s_g) = softplus(s_g).
- Optional velocity KL β_KL·mean (v_θ − v_ref)² to the base model, added by the caller.

Everything is float32; groups are given by integer ids, G is each group's count in the batch
(callers keep groups whole).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from omnirl.algorithms._tensors import f32, require, same_shape


class DGPOLoss(NamedTuple):
    """Scalar float32 tensors, plus the per-(sample, draw) group weights."""

    loss: Tensor
    policy_loss: Tensor
    kl: Tensor
    group_nll: Tensor
    group_weight: Tensor


def group_preference(error: Tensor, error_ref: Tensor, advantages: Tensor, groups: Tensor, beta: float) -> Tensor:
    """s `[B, K]`: each sample's group statistic β/G_g·Σ_{j∈g} A_j·(ℓ_θ,j − ℓ_ref,j), per draw k.

    Args:
        error, error_ref: `[B, K]` matching errors of θ and the reference (detached inside).
        advantages: `[B]` group-relative advantages.
        groups: `[B]` int64 group ids (any values; equal id = same group).
        beta: β > 0.
    Returns:
        `[B, K]` float32, equal for members of one group.
    Raises:
        ValueError: shapes differ, non-finite inputs, or β ≤ 0.
    """
    error, error_ref = f32(error, "error").detach(), f32(error_ref, "error_ref").detach()
    same_shape(error, error_ref, "error", "error_ref")
    if error.dim() != 2:
        raise ValueError(f"error must be [B, K], got shape {list(error.shape)}")
    adv = f32(advantages, "advantages").reshape(-1)
    if adv.shape[0] != error.shape[0] or groups.shape != adv.shape:
        raise ValueError(f"advantages {list(adv.shape)} and groups {list(groups.shape)} must be [B] with "
                         f"B = {error.shape[0]}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    require(torch.isfinite(error).all() & torch.isfinite(error_ref).all() & torch.isfinite(adv).all(),
            "non-finite matching error or advantage")
    # a [B, B] membership mask, not unique()/bincount(): those size their output from the data, a host
    # sync per loss on an accelerator; B is a step's samples (tens to hundreds), so B²·K stays small
    same = (groups[:, None] == groups[None, :]).to(error.dtype)  # [B, B]
    size = same.sum(dim=1)  # G_g of each sample's group
    term = adv[:, None] * (error - error_ref)  # [B, K]
    sums = (same[:, :, None] * term[None, :, :]).sum(dim=1)  # [B, K]: Σ over the sample's group
    return beta * sums / size[:, None]


def dgpo_loss(error: Tensor, error_ref: Tensor, advantages: Tensor, groups: Tensor, beta: float, *,
              kl: Tensor | None = None, kl_coef: float = 0.0) -> DGPOLoss:
    """loss = mean_{b,k} σ(s_bk)·A_b·ℓ_θ,bk + kl_coef·mean kl, σ(s) detached (see the module docstring).

    Args:
        error: `[B, K]` ℓ_θ (differentiable); error_ref: `[B, K]` ℓ_ref.
        advantages: `[B]`; groups: `[B]` int64 group ids; beta: β > 0.
        kl: `[B, K]` velocity KL to the base model (differentiable) or None; kl_coef ≥ 0.
    Returns:
        `DGPOLoss` (loss, policy_loss, kl, group_nll = mean softplus(s) over (sample, draw),
        group_weight = σ(s) `[B, K]`).
    Raises:
        ValueError: as `group_preference`, or a KL of another shape.
    """
    s = group_preference(error, error_ref, advantages, groups, beta)
    weight = torch.sigmoid(s)
    adv = f32(advantages, "advantages").reshape(-1, 1)
    policy = (weight * adv * f32(error, "error")).mean()
    kl_mean = torch.zeros((), dtype=torch.float32, device=error.device)
    if kl is not None:
        same_shape(f32(kl, "kl"), error, "kl", "error")
        kl_mean = kl.mean()
    return DGPOLoss(policy + kl_coef * kl_mean, policy.detach(), kl_mean.detach(), F.softplus(s).mean(), weight)
