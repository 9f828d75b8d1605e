"""`pairwise-contrast`: a toy group-level scorer, for testing and demonstrating the group
protocol (:class:`omnirl.scorers.base.GroupScorer`), not for training a real model.

Each member of a group is compared with every other member, as a pairwise preference model
would: it wins a pair when its RMS contrast (population std of its grayscale pixels, 0–255
scale) is higher, ties count one half. Its reward is its win rate

    r_i = (1 / (G − 1)) · Σ_{j≠i} ( [c_i > c_j] + ½ [c_i = c_j] ),

so rewards lie in [0, 1] and a group's rewards always average ½ (a lone sample gets ½).
"""

from __future__ import annotations

import numpy as np

from omnirl.scorers.base import ScorerError, check_batch, check_rewards


def rms_contrast(images: np.ndarray) -> np.ndarray:
    """`[G]` float64 std of each image's grayscale (mean of R, G, B) pixels, 0–255 scale."""
    gray = images.astype(np.float64).mean(axis=3)
    return gray.reshape(len(images), -1).std(axis=1)


def win_rates(values: np.ndarray) -> np.ndarray:
    """`[G]` float32 win rate of each value against the others (ties ½; ½ for G = 1)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 1:
        return np.full(1, 0.5, dtype=np.float32)
    wins = (v[:, None] > v[None, :]).sum(1) + 0.5 * ((v[:, None] == v[None, :]).sum(1) - 1)
    return (wins / (v.size - 1)).astype(np.float32)


class PairwiseContrastScorer:
    """The toy group scorer of the module docstring."""

    name = "pairwise_contrast"

    def score_group(self, images: np.ndarray, prompts: list[str], sample_ids: list[str]) -> np.ndarray:
        """`[G]` float32 win rates. Raises ScorerError for a malformed group."""
        check_batch(images, prompts, sample_ids)
        if len(set(prompts)) > 1:
            raise ScorerError("", f"a group holds one prompt, got {len(set(prompts))} different prompts")
        return check_rewards(win_rates(rms_contrast(images)), sample_ids)
