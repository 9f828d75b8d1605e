"""OCR reward of a video: flow_grpo's `video_ocr` rule over every k-th frame, read by the PP-OCRv4 recogniser
(`omnirl.reward.ocr.OCRScorer`, restricted to an alphabet; nothing is downloaded).

flow_grpo (`flow_grpo/ocr.py::OcrScorer_video_or_image`, the reward of its Wan2.1 video-OCR recipe): the target is
the prompt's quoted text; the frames read are `video[::4]`; each frame scores r = 1 − min(d, n)/n with d the
Levenshtein distance between the frame's reading and the target and n the target's length (both lower-cased,
spaces removed; unlike the image rule there is no "target inside the reading counts as exact" shortcut); the
video's reward is the mean of r over the frames with r > 0 (a frame where nothing of the text is read does not
pull the mean down), and 0 when no frame reads anything of it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from omnirl.reward.frames import Media, frame_indices, media_of
from omnirl.scorers.base import ScorerError, check_rewards
from omnirl.scorers.text import levenshtein, read_target

FRAME_STRIDE = 4
"""flow_grpo's `frame_interval`."""


def frame_reward(target: str, reading: str) -> float:
    """flow_grpo's per-frame video OCR reward 1 − min(Levenshtein(reading, target), n)/n, n = len(target), both
    lower-cased with spaces removed.

    Raises:
        ValueError: the target is empty after removing spaces.
    """
    target = target.replace(" ", "").lower()
    reading = reading.replace(" ", "").lower()
    if not target:
        raise ValueError("OCR target text is empty; quote the text to draw in the prompt")
    return 1.0 - min(levenshtein(reading, target), len(target)) / len(target)


def video_reward(frame_rewards: Sequence[float]) -> float:
    """flow_grpo's video reward: the mean of the frames' rewards that are > 0, else 0."""
    positive = [r for r in frame_rewards if r > 0]
    return sum(positive) / len(positive) if positive else 0.0


class VideoOCRScorer:
    """flow_grpo's video OCR reward (module docstring) with the in-process PP-OCRv4 recogniser.

    Args:
        alphabet: characters the reading may contain (`OCRScorer`).
        frame_stride: read every `frame_stride`-th frame (flow_grpo: 4).
        threads, batch_size: the recogniser's (`OCRScorer`).
    Attributes:
        name: "video_ocr". modalities: {"video"}.
    Raises:
        ValueError: an alphabet the recogniser cannot read, a stride < 1.
    """

    name = "video_ocr"
    modalities = frozenset({"video"})

    def __init__(self, alphabet: str = "0123456789", frame_stride: int = FRAME_STRIDE, threads: int = 1,
                 batch_size: int = 64) -> None:
        from omnirl.reward.ocr import OCRScorer

        frame_indices(1, stride=frame_stride)
        self.ocr = OCRScorer(alphabet=alphabet, threads=threads, batch_size=batch_size)
        self.frame_stride = frame_stride

    def readings(self, video: np.ndarray) -> list[str]:
        """The recogniser's reading of each sampled frame of one video `[T, H, W, 3]` uint8."""
        return self.ocr.read(np.ascontiguousarray(video[:: self.frame_stride]))

    def score_media(self, media: Sequence[Media], prompts: list[str], sample_ids: list[str]) -> np.ndarray:
        """`[B]` float32 rewards in [0, 1].

        Raises:
            ScorerError: malformed media, a prompt without quoted text, or a recogniser failure.
        """
        media_of(media, prompts, sample_ids, {"video"})
        rewards = np.zeros(len(sample_ids), dtype=np.float32)
        for i, (sample, prompt, sid) in enumerate(zip(media, prompts, sample_ids, strict=True)):
            target = read_target(prompt, sid)
            try:
                readings = self.readings(np.asarray(sample["video"]))
            except Exception as err:  # onnxruntime raises its own exception types
                raise ScorerError(sid, f"OCR recogniser failed: {err}") from err
            rewards[i] = video_reward([frame_reward(target, r) for r in readings])
        return check_rewards(rewards, sample_ids)
