"""Scoring video with image scorers: which frames to read, and the wrapper that averages an image scorer over them.

Media (docs/families-video.md, the multi-modal contract §3): one sample's decoded media is a dict of numpy arrays,
`"video"` uint8 `[T, H, W, 3]`, `"fps"` float32 0-d, `"audio"` float32 `[L]` in [−1, 1], `"audio_sample_rate"`
int64 0-d. Most video rewards are image rewards over sampled frames (flow_grpo: OCR on every 4th frame; PickScore on
3–8 frames elsewhere): `FrameSampledScorer` turns any `Scorer` into one of video.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from omnirl.scorers.base import Scorer, ScorerError, check_rewards, score_each

Media = Mapping[str, np.ndarray]


def frame_indices(frames: int, *, stride: int | None = None, count: int | None = None) -> list[int]:
    """Which of `frames` frames to read: every `stride`-th from the first (0, k, 2k, …; flow_grpo's `video[::k]`),
    or n = min(`count`, T) evenly spaced ones including the first and the last (round(i·(T − 1)/(n − 1))).

    Raises:
        ValueError: neither or both of stride/count, a value < 1, or no frames.
    """
    if (stride is None) == (count is None):
        raise ValueError("give exactly one of stride (every k-th frame) or count (n evenly spaced frames)")
    if frames < 1:
        raise ValueError(f"a video of {frames} frames has nothing to read")
    if stride is not None:
        if stride < 1:
            raise ValueError(f"frame stride must be >= 1, got {stride}")
        return list(range(0, frames, stride))
    if count < 1:
        raise ValueError(f"frame count must be >= 1, got {count}")
    n = min(count, frames)
    if n == 1:
        return [0]
    return sorted({round(i * (frames - 1) / (n - 1)) for i in range(n)})


def media_of(media: Sequence[Media], prompts: Sequence[str], sample_ids: Sequence[str], keys: set[str]) -> None:
    """Check a media batch: as many prompts and ids as samples, and each sample holds `keys` in the contract's
    dtypes and shapes (video uint8 `[T, H, W, 3]`, audio float32 `[L]` with a sample rate > 0).

    Raises:
        ScorerError: naming the sample (or "" when the lengths disagree) and what is wrong.
    """
    if not len(media) == len(prompts) == len(sample_ids):
        raise ScorerError("", f"got {len(media)} media, {len(prompts)} prompts and {len(sample_ids)} sample_ids; "
                              "pass one of each per sample")
    for sample, sid in zip(media, sample_ids, strict=True):
        missing = sorted(k for k in keys if k not in sample)
        if missing:
            raise ScorerError(sid, f"its media lacks {missing} (has {sorted(sample)}); this reward needs a family "
                                   f"that makes {', '.join(sorted(keys))}")
        if "video" in keys:
            video = np.asarray(sample["video"])
            if video.dtype != np.uint8 or video.ndim != 4 or video.shape[-1] != 3 or video.shape[0] < 1:
                raise ScorerError(sid, f"video must be uint8 [T, H, W, 3], got {video.dtype} {list(video.shape)}")
        if "audio" in keys:
            audio = np.asarray(sample["audio"])
            rate = int(np.asarray(sample.get("audio_sample_rate", 0)))
            if audio.dtype != np.float32 or audio.ndim != 1 or audio.size < 1 or rate < 1:
                raise ScorerError(sid, f"audio must be float32 [L] with audio_sample_rate > 0, got {audio.dtype} "
                                       f"{list(audio.shape)} at {rate} Hz")


class FrameSampledScorer:
    """Any image scorer over a video's sampled frames: the sample's reward is the mean of its frames' rewards.

    Args:
        scorer: the image scorer (`Scorer.score(images [N, H, W, 3] uint8, prompts, ids)`).
        stride: read every `stride`-th frame; count: read `count` evenly spaced frames (exactly one of them).
    Attributes:
        name: `"<scorer>@frames"`. modalities: {"video"}.
    Raises:
        ValueError: a bad stride/count (see `frame_indices`).
    """

    modalities = frozenset({"video"})

    def __init__(self, scorer: Scorer, *, stride: int | None = None, count: int | None = None) -> None:
        frame_indices(1, stride=stride, count=count)  # the arguments' own checks, now
        self.scorer, self.stride, self.count = scorer, stride, count
        self.name = f"{scorer.name}@frames"

    def score_media(self, media: Sequence[Media], prompts: list[str], sample_ids: list[str]) -> np.ndarray:
        """`[B]` float32: per sample the mean of the image scorer over its sampled frames, all frames of a batch in
        one call per frame size (each frame scored under its sample's prompt, its id `"<id>#f<k>"`).

        Raises:
            ScorerError: malformed media, or a frame the image scorer fails (naming the sample).
        """
        media_of(media, prompts, sample_ids, {"video"})
        rewards = np.zeros(len(sample_ids), dtype=np.float32)
        by_size: dict[tuple, list[tuple[int, int, np.ndarray]]] = {}
        for i, sample in enumerate(media):
            video = np.asarray(sample["video"])
            for k in frame_indices(video.shape[0], stride=self.stride, count=self.count):
                by_size.setdefault(video.shape[1:], []).append((i, k, video[k]))
        sums = np.zeros(len(sample_ids), dtype=np.float64)
        counts = np.zeros(len(sample_ids), dtype=np.int64)
        for frames in by_size.values():
            owners = [i for i, _, _ in frames]
            ids = [f"{sample_ids[i]}#f{k}" for i, k, _ in frames]
            outcome = score_each(self.scorer, np.stack([f for _, _, f in frames]), [prompts[i] for i in owners], ids)
            if outcome.errors:
                j = min(outcome.errors)
                raise ScorerError(sample_ids[owners[j]], f"{self.name}: frame {frames[j][1]}: "
                                                         f"{outcome.errors[j].reason}")
            np.add.at(sums, owners, outcome.values.astype(np.float64))
            np.add.at(counts, owners, 1)
        rewards[:] = sums / counts
        return check_rewards(rewards, sample_ids)
