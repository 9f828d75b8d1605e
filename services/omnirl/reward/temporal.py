"""Temporal consistency of a video (UniRL's term, docs/families-video.md): reward = 1 − mean |frame_{t+1} − frame_t|.

Pixels are read in [0, 1] (uint8 / 255); the mean runs over every pair of consecutive frames, every pixel and every
channel, so a still video scores 1, and a video whose every pixel flips between black and white every frame
scores 0. It rewards smoothness only (a still video wins), so it is meant as a small-weight term beside a
content reward, as UniRL uses it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from omnirl.reward.frames import Media, media_of
from omnirl.scorers.base import check_rewards


def temporal_consistency(video: np.ndarray) -> float:
    """1 − mean |x_{t+1} − x_t| of a uint8 video `[T, H, W, 3]` read in [0, 1]; 1 for a single frame."""
    if video.shape[0] < 2:
        return 1.0
    frames = video.astype(np.float32) / 255.0
    return float(1.0 - np.abs(np.diff(frames, axis=0)).mean())


class TemporalConsistencyScorer:
    """`temporal_consistency` of each sample's video.

    Attributes:
        name: "temporal_consistency". modalities: {"video"}.
    """

    name = "temporal_consistency"
    modalities = frozenset({"video"})

    def score_media(self, media: Sequence[Media], prompts: list[str], sample_ids: list[str]) -> np.ndarray:
        """`[B]` float32 rewards in [0, 1] (prompts are unused).

        Raises:
            ScorerError: malformed media.
        """
        media_of(media, prompts, sample_ids, {"video"})
        return check_rewards(np.array([temporal_consistency(np.asarray(m["video"])) for m in media], np.float32),
                             sample_ids)
