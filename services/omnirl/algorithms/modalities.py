"""Per-modality reductions of a flat multi-modal latent (docs/omni.md, "Joint training").

A multi-modal sample's latent is one flat fp32 vector `[D]`: each modality's latent flattened and
concatenated (video first, then audio; `omnirl.models.layout.LatentLayout`). The algorithms see it
through `Modalities`: where each modality lies in the vector and its loss weight.

- FlowGRPO's step log-prob is ONE Gaussian over the concatenation, averaged over the trained elements
  (`trained_mean`): (Σ_m D_m · logp_m) / Σ_m D_m over trained modalities m, the anchors' joint
  audio+video log-prob (VeRL-Omni, UniRL `audio_joint_sde`); a modality left out of the policy is
  excluded (its elements take the ODE update, `sde.sde_step(mask=)`).
- DiffusionNFT, AWM and DGPO sum per-modality terms: Σ_m w_m · (the per-element term averaged over
  modality m) (`weighted_mean`), with w normalised to sum 1 over the trained modalities (untrained: 0).
  One modality of weight 1 is exactly the element mean the image path uses.

With no `Modalities` (None: an image, the one-modality case) every function is the plain element mean.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from omnirl.algorithms._tensors import element_mean


class Modalities(NamedTuple):
    """How a flat per-sample latent `[D]` splits into modalities, and each one's loss weight.

    Attributes:
        bounds: `(start, stop)` of each modality in the flat latent, contiguous and in order from 0.
        weights: the loss weight of each modality, ≥ 0, summing to 1 (0 = left out of the policy).
    """

    bounds: tuple[tuple[int, int], ...]
    weights: tuple[float, ...]

    @property
    def numel(self) -> int:
        """D, the flat latent's size."""
        return self.bounds[-1][1]

    def trained_mask(self, device: torch.device | str = "cpu") -> Tensor:
        """`[D]` bool: True on the elements of modalities with weight > 0."""
        mask = torch.zeros(self.numel, dtype=torch.bool, device=device)
        for (start, stop), w in zip(self.bounds, self.weights, strict=True):
            if w > 0:
                mask[start:stop] = True
        return mask


def check_modalities(mods: Modalities) -> Modalities:
    """`mods` after checking its bounds tile `[0, D)` in order and its weights are ≥ 0 and sum to 1.

    Raises:
        ValueError: naming the first problem.
    """
    if not mods.bounds or len(mods.bounds) != len(mods.weights):
        raise ValueError(f"modalities need one weight per bound, got {len(mods.bounds)} bounds and "
                         f"{len(mods.weights)} weights")
    start = 0
    for lo, hi in mods.bounds:
        if lo != start or hi <= lo:
            raise ValueError(f"modality bounds {mods.bounds} must tile [0, D) in order, each non-empty")
        start = hi
    if any(w < 0 for w in mods.weights) or abs(sum(mods.weights) - 1.0) > 1e-6:
        raise ValueError(f"modality weights {mods.weights} must be >= 0 and sum to 1")
    return mods


def modality_means(t: Tensor, mods: Modalities) -> Tensor:
    """Per-sample mean of each modality's elements: `[B, ...]` (flat size D) → `[B, M]` float32."""
    flat = t.reshape(t.shape[0], -1)
    if flat.shape[1] != mods.numel:
        raise ValueError(f"a latent of {flat.shape[1]} elements does not match the modalities' {mods.numel}")
    return torch.stack([flat[:, lo:hi].mean(dim=1) for lo, hi in mods.bounds], dim=1)


def weighted_mean(t: Tensor, mods: Modalities | None) -> Tensor:
    """Σ_m w_m · mean_m(t) per sample, `[B, ...]` → `[B]`; the element mean when `mods` is None.

    Modalities of weight 0 are never read, so they contribute no value and no gradient.
    """
    if mods is None:
        return element_mean(t)
    flat = t.reshape(t.shape[0], -1)
    if flat.shape[1] != mods.numel:
        raise ValueError(f"a latent of {flat.shape[1]} elements does not match the modalities' {mods.numel}")
    parts = [w * flat[:, lo:hi].mean(dim=1) for (lo, hi), w in zip(mods.bounds, mods.weights, strict=True) if w > 0]
    return torch.stack(parts, dim=0).sum(dim=0)


def trained_mean(t: Tensor, mask: Tensor | None) -> Tensor:
    """Mean of each sample's elements where `mask` (`[D]` bool, the trained elements) holds: `[B, ...]` → `[B]`;
    the element mean when `mask` is None. Equals (Σ_m D_m · mean_m) / Σ_m D_m over the trained modalities."""
    if mask is None:
        return element_mean(t)
    flat = t.reshape(t.shape[0], -1)
    keep = mask.reshape(-1).to(device=flat.device, dtype=flat.dtype)  # a product, not an index: no device sync
    return (flat * keep).sum(dim=1) / keep.sum()
