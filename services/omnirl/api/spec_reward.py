"""What each scorer kind accepts in `spec.reward[].params` and `url`, checked at validate time.

`spec.reward[].params` stays a free-form string/number/boolean map in the CRD (each kind has its
own keys); `RewardSpec` validates it against the kind's model here, so `omnirl validate` and the
admission check reject an unknown key, an out-of-range value or a bad URL, naming the field
(`spec.reward[1].params.maxTokens: 0 is invalid: must be >= 1`). The reward package builds its
scorers from these same models (`RewardSpec.typed_params()`), so the two never disagree.
"""

from __future__ import annotations

import re
import string
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, model_validator

from omnirl.api._base import SpecModel
from omnirl.api.errors import FieldProblem
from omnirl.api.problems import dotted, requirement_text, walk

VLMTemplate = Literal["read-text", "rate", "yes-no"]


class OCRParams(SpecModel):
    """`kind: ocr`: PP-OCRv4 recogniser restricted to an alphabet (`omnirl.reward.ocr`)."""

    alphabet: str = Field("0123456789", min_length=1, max_length=256, description="Characters a reading may contain.")
    threads: int | None = Field(None, ge=1, le=64, description="onnxruntime intra-op threads (default: the reward "
                                "process's threads, OMNIRL_THREADS: the CPU cores `omnirl run` left to it, else 1).")
    batchSize: int = Field(64, ge=1, le=4096, description="Images per recogniser call.")


class JPEGParams(SpecModel):
    """`kind: jpeg`: JPEG compressibility (DDPO)."""

    quality: int = Field(95, ge=1, le=95, description="JPEG quality (DDPO used 95).")


class RemoteParams(SpecModel):
    """`kind: http` and `kind: grpc`: a scorer server speaking the omnirl scorer protocol."""

    maxRetries: int = Field(
        2, ge=0, le=10, description="Retries of a batch after a connection error, 408/429/5xx or gRPC UNAVAILABLE."
    )


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


class PairwiseContrastParams(SpecModel):
    """`kind: pairwise-contrast`: the built-in group-level test scorer; no parameters."""


class AVDigitsOCRParams(SpecModel):
    """`kind: avdigits-ocr`: the OCR of the built-in audio+video task's inked frames (`omnirl.reward.avdigits`)."""

    threads: int | None = Field(None, ge=1, le=64, description="onnxruntime intra-op threads (default: the reward "
                                "process's threads).")
    batchSize: int = Field(64, ge=1, le=4096, description="Frames per recogniser call.")


class NoParams(SpecModel):
    """A kind without parameters (`avdigits-beeps`, `avdigits-pitch`, `avdigits-sync`)."""


PARAMS_BY_KIND: dict[str, type[SpecModel]] = {
    "ocr": OCRParams, "jpeg": JPEGParams, "http": RemoteParams, "grpc": RemoteParams, "vlm": VLMParams,
    "pairwise-contrast": PairwiseContrastParams, "avdigits-ocr": AVDigitsOCRParams, "avdigits-beeps": NoParams,
    "avdigits-pitch": NoParams, "avdigits-sync": NoParams,
}
"""The params model of each scorer kind."""

_GRPC_TARGET = re.compile(r"^(dns:///)?(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?):(\d{1,5})$")


def parse_params(kind: str, params: dict[str, Any]) -> SpecModel:
    """The kind's params model built from `params` (strictly: `"8"` is not 8).

    Raises:
        FieldProblem: every unknown key at once (`params: ["a", "b"]`, or `params.a` for one), else
            the first bad value, with its path relative to the reward (`params.maxTokens`).
    """
    model = PARAMS_BY_KIND[kind]
    unknown = sorted(k for k in params if k not in model.model_fields)
    if len(unknown) > 1:  # one line for all of them: a user fixes a block of typos in one go
        allowed = ", ".join(model.model_fields) or "(none)"
        raise FieldProblem("params", unknown, f"unknown keys for kind {kind}; allowed: {allowed}")
    try:
        return model.model_validate(params, strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        problem = err.get("ctx", {}).get("error")
        if isinstance(problem, FieldProblem):  # a cross-key check of the params model
            raise FieldProblem(f"params.{problem.path}", problem.value, problem.requirement) from None
        path, ann, _ = walk(model, tuple(err["loc"]))
        where = "params." + dotted(path) if path else "params"
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(model.model_fields) or "(none)"
            raise FieldProblem(where, err["input"], f"unknown key for kind {kind}; allowed: {allowed}") from None
        if err["type"] == "missing":
            raise FieldProblem(where, None, f"required for kind {kind}") from None
        raise FieldProblem(where, err["input"], requirement_text(err, ann)) from None


def check_url(kind: str, url: str | None) -> None:
    """Check a reward's `url` for its kind.

    `http`: an http(s) URL of the score endpoint; `vlm`: an http(s) base URL of the OpenAI API
    (`http://judge:8000/v1`); `grpc`: `host:port` (or `dns:///host:port`); in-process kinds: none.

    Raises:
        FieldProblem: naming `url` and the expected form.
    """
    if kind not in ("http", "grpc", "vlm"):  # in-process kinds
        if url is not None:
            raise FieldProblem("url", url, f"must not be set for kind {kind} (it scores in-process)")
        return
    if not url:
        raise FieldProblem("url", url, f"required for kind {kind} (the scorer's endpoint)")
    if kind == "grpc":
        match = _GRPC_TARGET.match(url)
        if not match or not 1 <= int(match.group(4)) <= 65535:
            raise FieldProblem("url", url, "must be host:port (port 1..65535), e.g. ocr-scorer:50051")
        return
    example = "http://judge:8000/v1" if kind == "vlm" else "http://scorer:8000/v1/score"
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError when out of range
    except ValueError as err:
        raise FieldProblem("url", url, f"is not a valid URL ({err}); e.g. {example}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment or port == 0:
        raise FieldProblem("url", url, f"must be an http:// or https:// URL with a host and no query, e.g. {example}")
    endpoint = next((e for e in ("/chat/completions", "/completions") if parts.path.rstrip("/").endswith(e)), None)
    if kind == "vlm" and endpoint:  # the openai client appends the endpoint to the base URL itself
        raise FieldProblem("url", url, f"is the {endpoint} endpoint, not the API's base URL; drop {endpoint} "
                           f"(the client appends it), e.g. {example}")
