"""`kind: vlm`: a vision-language judge behind an OpenAI-compatible chat-completions endpoint
(`omnirl.reward.vlm`)."""

from __future__ import annotations

import string
from typing import Literal

from pydantic import Field, model_validator

from omnirl.api._base import SpecModel
from omnirl.api.errors import FieldProblem
from omnirl.scorers.kinds import NotOnThisMachine, RewardKind, register_kind

VLMTemplate = Literal["read-text", "rate", "yes-no"]


class VLMParams(SpecModel):
    """`kind: vlm`: a vision-language judge behind an OpenAI-compatible chat-completions endpoint."""

    model: str = Field(..., min_length=1, description="Model name the server serves (the request's `model`).")
    template: VLMTemplate = Field(
        ...,
        description="`read-text`: the reply is the text read, scored with the OCR rule against the prompt's "
        "quoted text; `rate`: an integer 1..scale, reward (k-1)/(scale-1); `yes-no`: reward P(yes) from logprobs.",
    )
    instruction: str | None = Field(
        None, min_length=1, max_length=4000,
        description="Replaces the template's question; may use {prompt} and (rate) {scale}.",
    )
    scale: int = Field(10, ge=2, le=100, description="`rate` only: the top of the 1..scale rating.")
    maxTokens: int | None = Field(
        None, ge=1, le=4096, description="Reply token limit (default: 64 read-text, 8 rate, 1 yes-no)."
    )
    topLogprobs: int = Field(
        5, ge=2, le=20, description="`yes-no` only: alternatives per token the server returns (yes and no must be among them)."
    )
    concurrency: int = Field(8, ge=1, le=256, description="Requests in flight at once.")
    batchSize: int = Field(64, ge=1, le=4096, description="Images encoded and submitted per wave.")
    maxRetries: int = Field(3, ge=0, le=10, description="Retries after a connection error, timeout, 408, 429 or 5xx.")
    apiKeyEnv: str | None = Field(
        None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Environment variable holding the API key (unset: the key `EMPTY`, as vLLM expects).",
    )
    frames: int = Field(0, ge=0, le=64, description="A video job: send n evenly spaced frames of each sample (the "
                        "first and the last among them) as images, in order (0: the poster frame only, as an image).")
    audio: bool = Field(False, description="An audio job: send each sample's soundtrack as an `input_audio` part "
                        "(16-bit PCM WAV, base64), for judges that hear (e.g. Qwen2.5-Omni behind vLLM).")

    def reads(self) -> tuple[str, ...]:
        """What the judge is sent, as the spec checks it against the family: video frames and/or sound, else images."""
        return (("video",) if self.frames else ()) + (("audio",) if self.audio else ()) or ("image",)

    @model_validator(mode="after")
    def _check(self) -> VLMParams:
        if "scale" in self.model_fields_set and self.template != "rate":
            raise FieldProblem("scale", self.scale, f"only applies to template rate, not {self.template}")
        if "topLogprobs" in self.model_fields_set and self.template != "yes-no":
            raise FieldProblem("topLogprobs", self.topLogprobs, f"only applies to template yes-no, not {self.template}")
        if self.instruction is not None:
            allowed = {"prompt", "scale"} if self.template == "rate" else {"prompt"}
            try:
                names = {name for _, name, _, _ in string.Formatter().parse(self.instruction) if name is not None}
            except ValueError as err:
                raise FieldProblem("instruction", self.instruction, f"is not a valid template ({err}); "
                                   "write literal braces as {{ and }}") from err
            if names - allowed:
                raise FieldProblem("instruction", self.instruction,
                                   f"may only use the placeholders {sorted(allowed)}, found {sorted(names - allowed)}")
        return self


def build(spec, params: VLMParams, *, threads: int, field: str):
    """A `VLMScorer` of the OpenAI API at `spec.url`."""
    from omnirl.reward.vlm import VLMScorer

    return VLMScorer(spec.name, spec.url, params, timeout_s=spec.timeoutSeconds, field=field)


def check_environment(params: VLMParams, field: str) -> None:
    """`params.apiKeyEnv`, when given, names a variable set here (`vlm.api_key`; unset: `NotOnThisMachine`)."""
    from omnirl.reward.vlm import api_key  # the openai client only for jobs with a VLM judge

    try:
        api_key(params.apiKeyEnv, f"{field}.params.apiKeyEnv")
    except ValueError as err:  # its only one: the variable is not set in this process's environment
        raise NotOnThisMachine(str(err)) from None


def check_endpoint(spec, params: VLMParams, field: str, strict: bool) -> None:
    """`vlm.check_judge`: the judge answers, takes its key and serves `params.model`."""
    from omnirl.reward.vlm import check_judge

    check_judge(field, spec.url, params, spec.timeoutSeconds, strict=strict)


KIND = register_kind(RewardKind(name="vlm", params=VLMParams, build=build, runs="remote", endpoint="openai",
                                reads_text=lambda params: params.template == "read-text",
                                check_environment=check_environment, check_endpoint=check_endpoint))
# images by default; a video's frames and its sound when params.frames/audio say (VLMParams.reads)
