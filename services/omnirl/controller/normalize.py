"""Per-reward normalisation before weighting (`reward[].normalize`), on one training step's batch.

The reward workers score one sample at a time and never see a group or a batch, so the
controller, which holds each step's complete groups, combines the components:

    reward_i = Σ_k weight_k · N_k(score_k)_i

with `N_k` one of (over the step's N samples, population statistics, `eps` guarding a zero spread):

- `none`:   x
- `group`:  (x − mean_g) / (std_g + eps), within each prompt's group g (GRPO's group z-score)
- `batch`:  (x − mean) / (std + eps), over the step
- `minmax`: (x − min) / (max − min + eps), over the step (0 when every value is equal)

A non-required component that failed on a sample is missing from that sample's `rewards`: it is
normalised over the samples that have it and contributes nothing to the others (as without
normalisation). Pure functions on numpy arrays; float64 internally, float32 out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from omnirl.api.spec import NormalizeMode, RewardSpec

EPS = 1e-8


def normalize(values: np.ndarray, groups: np.ndarray, mode: NormalizeMode, eps: float = EPS) -> np.ndarray:
    """One component normalised.

    Args:
        values: `[N]` scores (any float dtype).
        groups: `[N]` integer group index of each sample (used by `group` only).
        mode: `none`, `group`, `batch` or `minmax`.
        eps: added to the spread (std or range) so equal values give 0, not NaN.
    Returns:
        `[N]` float32.
    Raises:
        ValueError: unknown mode, or `values` and `groups` of different lengths.
    """
    x = np.asarray(values, dtype=np.float64)
    g = np.asarray(groups)
    if x.shape != g.shape or x.ndim != 1:
        raise ValueError(f"values {list(x.shape)} and groups {list(g.shape)} must be [N] of one length")
    if x.size == 0 or mode == "none":
        return x.astype(np.float32)
    if mode == "batch":
        return ((x - x.mean()) / (x.std() + eps)).astype(np.float32)
    if mode == "minmax":
        return ((x - x.min()) / (x.max() - x.min() + eps)).astype(np.float32)
    if mode == "group":
        out = np.empty_like(x)
        for gid in np.unique(g):
            m = g == gid
            out[m] = (x[m] - x[m].mean()) / (x[m].std() + eps)
        return out.astype(np.float32)
    raise ValueError(f"normalize mode {mode!r} is unknown; use none, group, batch or minmax")


def combine_step(specs: Sequence[RewardSpec], components: Sequence[Mapping[str, float]], groups: Sequence[int],
                 eps: float = EPS) -> np.ndarray:
    """The step's rewards `[N]` float32 from every sample's raw components.

    Args:
        specs: `spec.reward` (name, weight, normalize).
        components: per sample, reward name → raw score (a failed non-required reward is absent).
        groups: `[N]` group index of each sample.
    Raises:
        ValueError: a sample lacks a required component (it should have been refilled).
    """
    n = len(components)
    total = np.zeros(n, dtype=np.float64)
    g = np.asarray(groups)
    for spec in specs:
        present = np.array([spec.name in c for c in components], dtype=bool)
        if spec.required and not present.all():
            i = int(np.flatnonzero(~present)[0])
            raise ValueError(f"sample {i} has no score for required reward {spec.name!r}")
        if not present.any():
            continue
        raw = np.array([c[spec.name] for c in components if spec.name in c], dtype=np.float64)
        # `none` adds the float64 score as the reward role's `combine` does (normalize returns float32)
        part = raw if spec.normalize == "none" else normalize(raw, g[present], spec.normalize, eps).astype(np.float64)
        total[present] += spec.weight * part
    return total.astype(np.float32)


def raw_totals(specs: Sequence[RewardSpec], components: Sequence[Mapping[str, float]]) -> np.ndarray:
    """Every sample's reward before normalisation, `[N]` float64: Σ weight · raw score over the rewards
    it has (a failed non-required one is left out), as validation sums a held-out sample's.

    With a `normalize` other than `none` the step's trained rewards (`combine_step`) are z-scores or
    min-max ranks: their mean is Σ weight · mean(normalised), constant from step to step (0 for `group`
    and `batch`), so it cannot show learning; this sum can, on the scale of the held-out reward."""
    return np.array([sum(spec.weight * c[spec.name] for spec in specs if spec.name in c) for c in components],
                    dtype=np.float64)


def component_stats(specs: Sequence[RewardSpec], components: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per-component metrics of one step (raw scores): `reward_<name>` mean (over the samples
    that have it), `component_std_<name>` population std, `component_missing_<name>` samples
    without it."""
    stats: dict[str, float] = {}
    for spec in specs:
        raw = np.array([c[spec.name] for c in components if spec.name in c], dtype=np.float64)
        stats[f"component_missing_{spec.name}"] = float(len(components) - raw.size)
        if raw.size:
            stats[f"reward_{spec.name}"] = float(raw.mean())
            stats[f"component_std_{spec.name}"] = float(raw.std())
    return stats
