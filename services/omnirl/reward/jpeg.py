"""JPEG compressibility reward (Black et al. 2023, "Training Diffusion Models with Reinforcement
Learning" (DDPO), §6.1): reward = −(size of the image encoded as JPEG, in kB), kB = 1000 bytes.
Simpler images (flat regions, less texture/noise) score higher (closer to 0)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from omnirl.scorers.base import ScorerError, check_batch, check_rewards


class JPEGCompressibilityScorer:
    """reward = −JPEG size in kB at the given quality (PIL encoder, no chroma-subsampling override).

    Args:
        quality: JPEG quality 1..95 (DDPO used 95).
    Raises:
        ValueError: quality outside 1..95.
    """

    name = "jpeg_compressibility"

    def __init__(self, quality: int = 95) -> None:
        if not 1 <= quality <= 95:
            raise ValueError(f"quality must be in 1..95, got {quality}")
        self.quality = quality

    def score(self, images: np.ndarray, prompts: list[str], sample_ids: list[str]) -> np.ndarray:
        """Rewards `[B]` float32 (≤ 0, in −kB) of `[B, H, W, 3]` uint8 images; prompts are unused.

        Raises:
            ScorerError: malformed images or an encoder failure.
        """
        check_batch(images, prompts, sample_ids)
        rewards = np.empty(len(sample_ids), dtype=np.float32)
        for i, sample_id in enumerate(sample_ids):
            buffer = io.BytesIO()
            try:
                Image.fromarray(images[i]).save(buffer, format="JPEG", quality=self.quality)
            except (OSError, ValueError) as err:
                raise ScorerError(sample_id, f"JPEG encoding failed: {err}") from err
            rewards[i] = -buffer.tell() / 1000.0
        return check_rewards(rewards, sample_ids)
