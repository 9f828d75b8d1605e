"""The four reward kinds of the built-in audio+video task (docs/omni.md), scored in the reward workers on each
sample's media (`omnirl.reward.avdigits`): `avdigits-ocr` (video), `avdigits-beeps` and `avdigits-pitch` (audio),
`avdigits-sync` (video and audio)."""

from __future__ import annotations

from pydantic import Field

from omnirl.api._base import SpecModel
from omnirl.scorers.kinds import RewardKind, register_kind


class AVDigitsOCRParams(SpecModel):
    """`kind: avdigits-ocr`: the OCR of the inked frames (`omnirl.reward.avdigits.FrameOCRScorer`)."""

    threads: int | None = Field(None, ge=1, le=64, description="onnxruntime intra-op threads (default: the reward "
                                "process's threads).")
    batchSize: int = Field(64, ge=1, le=4096, description="Frames per recogniser call.")


class AVDigitsParams(SpecModel):
    """`kind: avdigits-beeps`, `avdigits-pitch`, `avdigits-sync`: no parameters (the task fixes the rules)."""


def build_ocr(spec, params: AVDigitsOCRParams, *, threads: int, field: str):
    """A `FrameOCRScorer`."""
    from omnirl.reward.avdigits import FrameOCRScorer

    return FrameOCRScorer(threads=params.threads or threads, batch_size=params.batchSize)


def _builder(kind: str):
    def build(spec, params: AVDigitsParams, *, threads: int, field: str):
        """The kind's scorer (`omnirl.reward.avdigits.SCORERS`)."""
        from omnirl.reward.avdigits import SCORERS

        return SCORERS[kind]()
    return build


OCR = register_kind(RewardKind(name="avdigits-ocr", params=AVDigitsOCRParams, build=build_ocr,
                               modalities=("video",), reads_text=lambda params: True))
BEEPS = register_kind(RewardKind(name="avdigits-beeps", params=AVDigitsParams, build=_builder("avdigits-beeps"),
                                 modalities=("audio",)))
PITCH = register_kind(RewardKind(name="avdigits-pitch", params=AVDigitsParams, build=_builder("avdigits-pitch"),
                                 modalities=("audio",)))
SYNC = register_kind(RewardKind(name="avdigits-sync", params=AVDigitsParams, build=_builder("avdigits-sync"),
                                modalities=("video", "audio")))
