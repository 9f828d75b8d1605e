"""Reward kinds that score video and audio in the reward workers (docs/families-video.md, "Rewards"):

- `video-ocr`: flow_grpo's video OCR rule over every k-th frame (`omnirl.reward.video_ocr`).
- `frames`: any in-process image kind (its own `params`) averaged over a video's sampled frames (`omnirl.reward.frames`).
- `temporal-consistency`: 1 − mean |frame difference| (`omnirl.reward.temporal`).
- `clap`: CLAP audio↔text cosine similarity from a local `ClapModel` directory (`omnirl.reward.clap`).
- `audio-signal`: loudness in range, clipping, silence; no weights (`omnirl.reward.audio_signal`).

ImageBind (audio↔video, as two anchors use) is not offered: its licence is non-commercial (CC-BY-NC-SA) and it
downloads its weights at run time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from omnirl.api._base import SpecModel
from omnirl.api.errors import FieldProblem
from omnirl.api.extensions import REWARD_KINDS, params_model
from omnirl.reward.kinds.ocr import check_prompts as ocr_check_prompts
from omnirl.scorers.kinds import NotOnThisMachine, RewardKind, register_kind


class VideoOCRParams(SpecModel):
    """`kind: video-ocr`: flow_grpo's video OCR rule (`omnirl.reward.video_ocr`)."""

    alphabet: str = Field("0123456789", min_length=1, max_length=256, description="Characters a reading may contain.")
    frameStride: int = Field(4, ge=1, le=1000, description="Read every k-th frame (flow_grpo: 4).")
    threads: int | None = Field(None, ge=1, le=64, description="onnxruntime intra-op threads (default: the reward "
                                "process's threads).")
    batchSize: int = Field(64, ge=1, le=4096, description="Frames per recogniser call.")


def build_video_ocr(spec, params: VideoOCRParams, *, threads: int, field: str):
    """A `VideoOCRScorer`. Raises ValueError naming `field.params.alphabet` for an alphabet the recogniser lacks."""
    from omnirl.reward.video_ocr import VideoOCRScorer

    try:
        return VideoOCRScorer(alphabet=params.alphabet, frame_stride=params.frameStride,
                              threads=params.threads or threads, batch_size=params.batchSize)
    except ValueError as err:
        raise ValueError(f"{field}.params.{err}") from err


class FramesParams(SpecModel):
    """`kind: frames`: an image kind averaged over a video's sampled frames (`omnirl.reward.frames`)."""

    kind: str = Field(..., min_length=1, description="The in-process image reward kind scoring each frame "
                      "(e.g. jpeg, ocr, python).")
    innerParams: str = Field("{}", max_length=8000, description="That kind's own params as a JSON object, e.g. "
                             "'{\"alphabet\": \"0123456789\"}' (spec.reward[].params holds scalars only).")
    frameStride: int | None = Field(None, ge=1, le=1000, description="Score every k-th frame (0, k, 2k, …).")
    frameCount: int | None = Field(None, ge=1, le=1000, description="Score n evenly spaced frames, the first and "
                                   "the last among them (instead of frameStride).")

    @model_validator(mode="after")
    def _check(self) -> FramesParams:
        info = REWARD_KINDS.get(self.kind)
        if info is None or info.runs != "in-process" or "image" not in info.modalities:
            images = sorted(k for k, i in REWARD_KINDS.items() if i.runs == "in-process" and "image" in i.modalities)
            raise FieldProblem("kind", self.kind, f"must be an in-process image kind: one of {', '.join(images)}")
        if (self.frameStride is None) == (self.frameCount is None):
            raise FieldProblem("frameStride", self.frameStride, "set exactly one of frameStride and frameCount")
        self.inner()
        return self

    def inner(self) -> SpecModel:
        """`innerParams` as the image kind's params model.

        Raises:
            FieldProblem: not a JSON object, or not that kind's params (naming `innerParams`).
        """
        try:
            raw = json.loads(self.innerParams)
        except ValueError as err:
            raise FieldProblem("innerParams", self.innerParams, f"must be a JSON object: {err}") from err
        if not isinstance(raw, dict):
            raise FieldProblem("innerParams", self.innerParams, "must be a JSON object (the kind's params)")
        try:
            return params_model(self.kind).model_validate(raw, strict=True)
        except ValueError as err:
            raise FieldProblem("innerParams", self.innerParams, f"are not {self.kind}'s params: "
                               f"{str(err).splitlines()[-2:]}") from err


def build_frames(spec, params: FramesParams, *, threads: int, field: str):
    """The image kind's scorer wrapped in a `FrameSampledScorer`."""
    from omnirl.reward.frames import FrameSampledScorer
    from omnirl.scorers.kinds import get_kind

    scorer = get_kind(params.kind).build(spec, params.inner(), threads=threads, field=f"{field}.params.innerParams")
    return FrameSampledScorer(scorer, stride=params.frameStride, count=params.frameCount)


class NoParams(SpecModel):
    """A kind without parameters (`temporal-consistency`)."""


def build_temporal(spec, params: NoParams, *, threads: int, field: str):
    """A `TemporalConsistencyScorer`."""
    from omnirl.reward.temporal import TemporalConsistencyScorer

    return TemporalConsistencyScorer()


class ClapParams(SpecModel):
    """`kind: clap`: CLAP audio↔text similarity (`omnirl.reward.clap`)."""

    path: str = Field(..., min_length=1, description="Local directory holding a ClapModel and its ClapProcessor "
                      "(save_pretrained of both, e.g. laion/larger_clap_general); relative paths resolve against the "
                      "reward process's working directory.")
    device: Literal["cpu", "cuda"] = Field("cpu", description="Where the CLAP model runs in the reward worker.")
    template: str = Field("{prompt}", min_length=1, max_length=1000, description="The text compared with the "
                          "audio; {prompt} is the prompt line.")
    batchSize: int = Field(16, ge=1, le=1024, description="Clips per model call.")


def build_clap(spec, params: ClapParams, *, threads: int, field: str):
    """A `ClapScorer` of `params.path`."""
    from omnirl.reward.clap import ClapScorer

    try:
        return ClapScorer(params.path, device=params.device, template=params.template, batch_size=params.batchSize)
    except (OSError, FileNotFoundError) as err:
        raise ValueError(f"{field}.params.path: {err}") from err


def check_clap(params: ClapParams, field: str) -> None:
    """The CLAP directory is on this machine (`omnirl validate` notes it otherwise: a cluster's pods may hold it).

    Raises:
        NotOnThisMachine: naming `field.params.path`.
    """
    if not (Path(params.path) / "config.json").is_file():
        raise NotOnThisMachine(f"{field}.params.path: {params.path} holds no CLAP model here (config.json); save "
                               "ClapModel and ClapProcessor there, or mount the directory into the reward pods")


class AudioSignalParams(SpecModel):
    """`kind: audio-signal`: a weightless audio measure (`omnirl.reward.audio_signal`)."""

    measure: Literal["loudness", "clipping", "silence"] = Field(..., description="loudness: RMS level in "
                                                                "[lowDb, highDb]; clipping: 1 − clipped fraction; "
                                                                "silence: 1 − silent-frame fraction.")
    lowDb: float = Field(-30.0, ge=-120, le=0, description="loudness: the range's low end, dBFS.")
    highDb: float = Field(-10.0, ge=-120, le=0, description="loudness: the range's high end, dBFS.")
    toleranceDb: float = Field(20.0, gt=0, le=120, description="loudness: dB outside the range where the reward "
                               "reaches 0 (linear).")
    clipLevel: float = Field(0.999, gt=0, le=1, description="clipping: |x| at or above this counts as clipped.")
    frameMs: float = Field(20.0, gt=0, le=10000, description="silence: frame length in milliseconds.")
    silenceDb: float = Field(-50.0, ge=-160, le=0, description="silence: a frame below this RMS level is silent.")

    @model_validator(mode="after")
    def _check(self) -> AudioSignalParams:
        if self.lowDb > self.highDb:
            raise FieldProblem("lowDb", self.lowDb, f"must be <= highDb ({self.highDb})")
        return self


def build_audio_signal(spec, params: AudioSignalParams, *, threads: int, field: str):
    """An `AudioSignalScorer` of `params.measure`."""
    from omnirl.reward.audio_signal import AudioSignalScorer

    return AudioSignalScorer(params.measure, low_db=params.lowDb, high_db=params.highDb,
                             tolerance_db=params.toleranceDb, clip_level=params.clipLevel, frame_ms=params.frameMs,
                             silence_db=params.silenceDb)


VIDEO_OCR = register_kind(RewardKind(name="video-ocr", params=VideoOCRParams, build=build_video_ocr,
                                     modalities=("video",), reads_text=lambda params: True,
                                     check_prompts=ocr_check_prompts))
FRAMES = register_kind(RewardKind(name="frames", params=FramesParams, build=build_frames, modalities=("video",)))
TEMPORAL = register_kind(RewardKind(name="temporal-consistency", params=NoParams, build=build_temporal,
                                    modalities=("video",)))
CLAP = register_kind(RewardKind(name="clap", params=ClapParams, build=build_clap, modalities=("audio",),
                                check_environment=check_clap))
AUDIO_SIGNAL = register_kind(RewardKind(name="audio-signal", params=AudioSignalParams, build=build_audio_signal,
                                        modalities=("audio",)))
