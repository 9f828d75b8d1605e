"""Audio rewards that need no weights: loudness in range, no clipping, no silence (docs/families-video.md).

Every measure reads the waveform `x` (float32 `[L]`, full scale ±1) and returns a reward in [0, 1]:

- `loudness`: the RMS level in dBFS, ℓ = 20·log10(sqrt(mean(x²))) (−inf for digital silence). Reward 1 when
  `lowDb ≤ ℓ ≤ highDb`, falling linearly to 0 over `toleranceDb` outside: 1 − min(1, d/toleranceDb) with d the
  distance in dB to the range.
- `clipping`: 1 − the fraction of samples with |x| ≥ `clipLevel` (0.999 by default: at full scale).
- `silence`: 1 − the fraction of silent frames: the waveform cut into frames of `frameMs` milliseconds (the last,
  partial one included), a frame silent when its RMS level is below `silenceDb` dBFS.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from omnirl.reward.frames import Media, media_of
from omnirl.scorers.base import ScorerError, check_rewards

MEASURES = ("loudness", "clipping", "silence")


def rms_dbfs(x: np.ndarray) -> float:
    """20·log10 of the RMS of `x` (dB relative to full scale 1.0); −inf when every sample is 0."""
    rms = math.sqrt(float(np.mean(np.square(x, dtype=np.float64))))
    return 20.0 * math.log10(rms) if rms > 0 else -math.inf


def loudness_reward(x: np.ndarray, low_db: float, high_db: float, tolerance_db: float) -> float:
    """1 inside [low_db, high_db], else 1 − min(1, d/tolerance_db), d the distance of the RMS level to the range."""
    level = rms_dbfs(x)
    distance = max(low_db - level, level - high_db, 0.0)
    return 1.0 - min(1.0, distance / tolerance_db)


def clipping_reward(x: np.ndarray, level: float) -> float:
    """1 − the fraction of samples with |x| ≥ `level`."""
    return 1.0 - float(np.mean(np.abs(x) >= level))


def silence_reward(x: np.ndarray, sample_rate: int, frame_ms: float, silence_db: float) -> float:
    """1 − the fraction of `frame_ms` frames whose RMS level is below `silence_db` dBFS."""
    n = max(1, int(round(sample_rate * frame_ms / 1000.0)))
    frames = [x[i:i + n] for i in range(0, len(x), n)]
    return 1.0 - sum(rms_dbfs(f) < silence_db for f in frames) / len(frames)


@dataclass(frozen=True)
class AudioSignalScorer:
    """One of the weightless audio measures (module docstring) of each sample's waveform.

    Args:
        measure: "loudness", "clipping" or "silence".
        low_db, high_db, tolerance_db: the loudness range and its fall-off (dBFS, dB).
        clip_level: the clipping threshold (fraction of full scale).
        frame_ms, silence_db: the silence frames' length and level.
    Attributes:
        name: "audio_<measure>". modalities: {"audio"}.
    Raises:
        ValueError: an unknown measure or inconsistent settings.
    """

    measure: str
    low_db: float = -30.0
    high_db: float = -10.0
    tolerance_db: float = 20.0
    clip_level: float = 0.999
    frame_ms: float = 20.0
    silence_db: float = -50.0

    modalities = frozenset({"audio"})

    def __post_init__(self) -> None:
        if self.measure not in MEASURES:
            raise ValueError(f"measure must be one of {MEASURES}, got {self.measure!r}")
        if not (self.low_db <= self.high_db and self.tolerance_db > 0 and 0 < self.clip_level <= 1
                and self.frame_ms > 0):
            raise ValueError("need lowDb <= highDb, toleranceDb > 0, 0 < clipLevel <= 1 and frameMs > 0")

    @property
    def name(self) -> str:
        return f"audio_{self.measure}"

    def score_media(self, media: Sequence[Media], prompts: list[str], sample_ids: list[str]) -> np.ndarray:
        """`[B]` float32 rewards in [0, 1] (prompts are unused).

        Raises:
            ScorerError: malformed media or a non-finite waveform.
        """
        media_of(media, prompts, sample_ids, {"audio"})
        rewards = np.zeros(len(sample_ids), dtype=np.float32)
        for i, (sample, sid) in enumerate(zip(media, sample_ids, strict=True)):
            x = np.asarray(sample["audio"], dtype=np.float32)
            if not np.isfinite(x).all():
                raise ScorerError(sid, "the waveform holds NaN or inf samples")
            if self.measure == "loudness":
                rewards[i] = loudness_reward(x, self.low_db, self.high_db, self.tolerance_db)
            elif self.measure == "clipping":
                rewards[i] = clipping_reward(x, self.clip_level)
            else:
                rewards[i] = silence_reward(x, int(np.asarray(sample["audio_sample_rate"])), self.frame_ms,
                                            self.silence_db)
        return check_rewards(rewards, sample_ids)
