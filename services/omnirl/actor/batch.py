"""A training batch as the actor sees it, and micro-batching that keeps shapes identical."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from omnirl.algorithms.modalities import Modalities

GridOf = Callable[[tuple[int, ...]], torch.Tensor]
"""Latent shape `(C, H, W)` → the rollout σ grid `[N+1]` fp32 of samples of that shape."""


@dataclass
class TrainSample:
    """One scored sample with its trajectory (tensors fp32, CPU).

    Attributes:
        sample_id: stable id `{step}:{prompt}:{index}`.
        group_id: the prompt group it belongs to (members share the SDE window and NFT noise).
        prompt_ids: token ids exactly as the controller produced them.
        advantage: group-relative advantage (already clamped).
        x0: final latent `[C, H, W]`.
        latents: `[W+1, C, H, W]` window latents (FlowGRPO); `[0, C, H, W]` for ODE rollouts.
        log_probs: `[W]` rollout log-probs of the window transitions.
        sigmas: `[W+1]` σ at each window latent.
        noise_level: SDE noise level the rollout used.
        sde_type: "sde" or "cps".
    """

    sample_id: str
    group_id: str
    prompt_ids: list[int]
    advantage: float
    x0: torch.Tensor
    latents: torch.Tensor
    log_probs: torch.Tensor
    sigmas: torch.Tensor
    noise_level: float
    sde_type: str


def modalities_of(adapter, samples: list[TrainSample]) -> Modalities | None:
    """The modalities and loss weights of a micro-batch's flat latent (`adapter.latent_layout`, docs/omni.md,
    "Joint training"); None for an image family (one modality: the element mean, today's losses). A
    micro-batch holds one latent shape, so its first sample's layout is every sample's."""
    layout_of = getattr(adapter, "latent_layout", None)
    return None if layout_of is None else layout_of(list(samples[0].prompt_ids)).modalities()


def trained_mask_of(adapter, samples: list[TrainSample]) -> torch.Tensor | None:
    """`[D]` bool, the trained elements of a micro-batch's flat latent, for FlowGRPO's log-prob and KL; None when
    every element is trained (an image family, or every modality in the policy): the plain element mean."""
    layout_of = getattr(adapter, "latent_layout", None)
    if layout_of is None:
        return None
    layout = layout_of(list(samples[0].prompt_ids))
    return None if layout.all_trained else layout.trained_mask()


def micro_batches(samples: list[TrainSample], size: int, *, keep_groups: bool = False) -> list[list[TrainSample]]:
    """Split into micro-batches of at most `size` samples with one latent shape each.

    Shapes are never mixed or padded, so training sees exactly the shapes rollout produced. With
    `keep_groups`, a group that fits in one micro-batch is never split across two; a larger group
    (groupSize > microBatchSize) is cut into chunks of `size`, so no micro-batch ever exceeds
    `size` (the memory the user budgeted). Splitting a group changes no number beyond float
    rounding: DiffusionNFT's and AWM's per-group σ and ε are keyed by the group id, not drawn per
    micro-batch, and micro-batch losses are weighted by their share of the minibatch. Order inside
    a shape follows the input order.
    """
    if size < 1:
        raise ValueError(f"micro-batch size must be >= 1, got {size}")
    by_shape: dict[tuple, list[TrainSample]] = {}
    for s in samples:
        by_shape.setdefault(tuple(s.x0.shape), []).append(s)
    out: list[list[TrainSample]] = []
    for items in by_shape.values():
        if not keep_groups:
            out.extend(items[i : i + size] for i in range(0, len(items), size))
            continue
        groups: dict[str, list[TrainSample]] = {}
        for s in items:
            groups.setdefault(s.group_id, []).append(s)
        cur: list[TrainSample] = []
        for members in groups.values():
            if cur and len(cur) + len(members) > size:
                out.append(cur)
                cur = []
            while len(members) > size:  # only when cur is empty: a group larger than a micro-batch
                out.append(members[:size])
                members = members[size:]
            cur.extend(members)
        if cur:
            out.append(cur)
    return out


def group_shapes(samples: list[TrainSample]) -> dict[str, tuple[int, ...]]:
    """Each group's latent shape `(C, H, W)` (a group is sampled at one size), in first-seen order."""
    return {s.group_id: tuple(s.x0.shape) for s in samples}


def group_minibatches(samples: list[TrainSample], updates: int, seed: int) -> list[list[TrainSample]]:
    """Split a batch into `min(updates, groups)` minibatches of whole groups (one optimiser step
    each): groups in first-seen order, shuffled by `seed`, dealt round-robin (minibatch m takes
    groups m, m + n, …). Shared by the DiffusionNFT and AWM updates."""
    groups: dict[str, list[TrainSample]] = {}
    for s in samples:
        groups.setdefault(s.group_id, []).append(s)
    order = list(groups)
    random.Random(seed).shuffle(order)
    n_mini = min(updates, len(order))
    return [[s for g in order[m::n_mini] for s in groups[g]] for m in range(n_mini)]


def stack_window(samples: list[TrainSample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """latents `[B, W+1, C, H, W]`, log_probs `[B, W]`, sigmas `[B, W+1]` of one micro-batch.

    Raises:
        ValueError: window lengths differ (requests of one step share one window).
    """
    lengths = {int(s.log_probs.shape[0]) for s in samples}
    if len(lengths) != 1:
        raise ValueError(f"samples of one micro-batch have different SDE window lengths {sorted(lengths)}")
    return (
        torch.stack([s.latents for s in samples]),
        torch.stack([s.log_probs for s in samples]),
        torch.stack([s.sigmas for s in samples]),
    )
