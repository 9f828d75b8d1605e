"""Group-relative advantages (GRPO).

References: Shao et al., DeepSeekMath (arXiv 2402.03300) §4.1.2 "outcome supervision":
A_i = (r_i − mean(r_group)) / std(r_group); Flow-GRPO (arXiv 2505.05470) applies it to images
with ε = 1e-4 and, in its reference code and in VeRL-Omni, the std taken over the whole batch
(`global_std`) by default, the mean always per group; advantages clamped to ±5.

Implementation details:
- std is the population std (`unbiased=False`, numpy's default as in Flow-GRPO's code).
- A group whose rewards are all equal (reward std 0, including a group of one) carries no
  signal: its advantages are set to exactly 0 and it is counted in `zero_std_groups`, in both
  std modes (in "global" mode r − group mean would be 0 anyway, up to rounding).
- The example of docs/algorithms/index.md ("Group advantages"), rewards [0.3, 0.9, 0.5, 0.7] in groups [0, 0, 1, 1] →
  [−1.34, +1.34, −0.45, +0.45], is produced by std_mode="global" (batch std 0.2236); per-group
  std (0.3 and 0.1) gives [−1.0, +1.0, −1.0, +1.0].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from omnirl.algorithms._tensors import f32

STD_MODES = ("group", "global")


@dataclass(frozen=True)
class AdvantageResult:
    """Result of `group_advantages`.

    Attributes:
        advantages: `[N]` float32, one per trajectory (broadcast by the caller to every trained step).
        zero_std_groups: number of groups whose rewards are all equal (their advantages are 0).
        num_groups: number of distinct group ids.
    """

    advantages: Tensor
    zero_std_groups: int
    num_groups: int


def _check_inputs(rewards: Tensor, group_ids: Tensor, std_mode: str, eps: float, clip: float) -> Tensor:
    if std_mode not in STD_MODES:
        raise ValueError(f"std_mode must be one of {STD_MODES}, got {std_mode!r}")
    if not (eps >= 0.0 and math.isfinite(eps)):
        raise ValueError(f"eps must be finite and >= 0, got {eps!r}")
    if not clip > 0.0:
        raise ValueError(f"clip must be > 0 (use math.inf for no clipping), got {clip!r}")
    rewards = f32(rewards, "rewards")
    if rewards.dim() != 1 or rewards.numel() == 0:
        raise ValueError(f"rewards must have shape [N] with N >= 1, got {tuple(rewards.shape)}")
    if not isinstance(group_ids, Tensor) or group_ids.dtype != torch.int64:
        raise TypeError(f"group_ids must be an int64 tensor, got {getattr(group_ids, 'dtype', type(group_ids))}")
    if group_ids.shape != rewards.shape:
        raise ValueError(f"group_ids {tuple(group_ids.shape)} must have the shape of rewards {tuple(rewards.shape)}")
    finite = torch.isfinite(rewards)
    if not bool(finite.all()):
        bad = (~finite).nonzero().flatten().tolist()
        raise ValueError(f"rewards must be finite; NaN/inf at indices {bad} (values {rewards[bad].tolist()}): "
                         "fix the reward function instead of feeding it to the advantage")
    return rewards


def group_advantages(rewards: Tensor, group_ids: Tensor, std_mode: str = "group", eps: float = 1e-4,
                     clip: float = 5.0) -> AdvantageResult:
    """A_i = clamp((r_i − mean_{g(i)} r) / (std + eps), −clip, clip), zero for zero-std groups.

    The mean is over the trajectory's group; std is the population std (unbiased=False) over
    the group (std_mode="group") or over the whole batch (std_mode="global", Flow-GRPO's and
    VeRL-Omni's default). DeepSeekMath (arXiv 2402.03300) §4.1.2; Flow-GRPO (arXiv 2505.05470).

    Example (docs/algorithms/index.md, "Group advantages"): rewards [0.3, 0.9, 0.5, 0.7], group_ids [0, 0, 1, 1]:
    "global" → batch std 0.2236 → [−1.341, 1.341, −0.447, 0.447];
    "group" → group stds 0.3, 0.1 → [−1.000, 1.000, −0.999, 0.999] (eps shrinks them slightly).

    Args:
        rewards: `[N]` floating (cast to float32), finite.
        group_ids: `[N]` int64, any values; equal ids = same prompt group.
        std_mode: "group" or "global".
        eps: added to the std (1e-4 in Flow-GRPO), ≥ 0.
        clip: clamp bound (> 0), 5.0 in Flow-GRPO.
    Returns:
        AdvantageResult(advantages [N] float32, zero_std_groups, num_groups).
    Raises:
        ValueError: NaN/inf rewards (naming the indices), bad shapes, std_mode, eps or clip.
        TypeError: group_ids not int64.
    """
    rewards = _check_inputs(rewards, group_ids, std_mode, eps, clip)
    _, inverse = torch.unique(group_ids.to(rewards.device), return_inverse=True)
    num_groups = int(inverse.max().item()) + 1
    counts = torch.zeros(num_groups, device=rewards.device).index_add_(0, inverse, torch.ones_like(rewards))
    group_mean = torch.zeros(num_groups, device=rewards.device).index_add_(0, inverse, rewards) / counts
    centred = rewards - group_mean[inverse]
    if std_mode == "group":
        group_var = torch.zeros(num_groups, device=rewards.device).index_add_(0, inverse, centred**2) / counts
        std = group_var.sqrt()[inverse]
    else:
        std = rewards.std(correction=0).expand_as(rewards)
    group_max = torch.full((num_groups,), -math.inf, device=rewards.device).scatter_reduce_(
        0, inverse, rewards, reduce="amax")
    group_min = torch.full((num_groups,), math.inf, device=rewards.device).scatter_reduce_(
        0, inverse, rewards, reduce="amin")
    zero_std = group_max == group_min
    advantages = (centred / (std + eps)).clamp(-clip, clip)
    advantages = torch.where(zero_std[inverse], torch.zeros_like(advantages), advantages)
    return AdvantageResult(advantages=advantages, zero_std_groups=int(zero_std.sum().item()),
                           num_groups=num_groups)
