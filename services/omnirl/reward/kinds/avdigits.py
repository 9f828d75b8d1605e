"""`kind: avdigits-ocr | avdigits-beeps | avdigits-pitch | avdigits-sync`: the four terms of the built-in audio+video
task (model.family av-digits; docs/omni.md), scored in the reward workers (`omnirl.reward.avdigits`)."""

from __future__ import annotations

from pydantic import Field

from omnirl.api._base import SpecModel
from omnirl.reward.kinds import RewardKind, register_kind


class AVDigitsOCRParams(SpecModel):
    """`kind: avdigits-ocr`: the OCR of the built-in audio+video task's inked frames (`omnirl.reward.avdigits`)."""

    threads: int | None = Field(None, ge=1, le=64, description="onnxruntime intra-op threads (default: the reward "
                                "process's threads).")
    batchSize: int = Field(64, ge=1, le=4096, description="Frames per recogniser call.")


class NoParams(SpecModel):
    """A kind without parameters (`avdigits-beeps`, `avdigits-pitch`, `avdigits-sync`)."""


def build_ocr(spec, params: AVDigitsOCRParams, *, threads: int, field: str):
    """The frame OCR of the task's inked frames."""
    from omnirl.reward.avdigits import FrameOCRScorer

    return FrameOCRScorer(threads=params.threads or threads, batch_size=params.batchSize)


def build_plain(spec, params: NoParams, *, threads: int, field: str):
    """The kind's scorer (`omnirl.reward.avdigits.SCORERS`)."""
    from omnirl.reward.avdigits import SCORERS

    return SCORERS[spec.kind]()


OCR = register_kind(RewardKind(name="avdigits-ocr", params=AVDigitsOCRParams, build=build_ocr, modalities=("video",)))
BEEPS = register_kind(RewardKind(name="avdigits-beeps", params=NoParams, build=build_plain, modalities=("audio",)))
PITCH = register_kind(RewardKind(name="avdigits-pitch", params=NoParams, build=build_plain, modalities=("audio",)))
SYNC = register_kind(RewardKind(name="avdigits-sync", params=NoParams, build=build_plain,
                                modalities=("video", "audio")))
