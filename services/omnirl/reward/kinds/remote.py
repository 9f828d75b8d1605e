"""`kind: http` and `kind: grpc`: a scorer server speaking the omnirl scorer protocol (`omnirl.reward.remote`;
serve one with `omnirl scorer serve`)."""

from __future__ import annotations

from pydantic import Field, model_validator

from omnirl.api._base import SpecModel
from omnirl.api.errors import FieldProblem
from omnirl.scorers.kinds import RewardKind, register_kind


class RemoteParams(SpecModel):
    """`kind: http` and `kind: grpc`: a scorer server speaking the omnirl scorer protocol."""

    maxRetries: int = Field(
        2, ge=0, le=10, description="Retries of a batch after a connection error, 408/429/5xx or gRPC UNAVAILABLE."
    )
    frameStride: int | None = Field(None, ge=1, le=1000, description="A video job: send every k-th frame of each "
                                    "sample (1: all of them) as PNGs, with the clip's fps (unset: no video).")
    frameCount: int | None = Field(None, ge=1, le=1000, description="A video job: send n evenly spaced frames, the "
                                   "first and the last among them (instead of frameStride).")
    audio: bool = Field(False, description="An audio job: send each sample's soundtrack (mono float32 PCM and its "
                        "sample rate).")

    def reads(self) -> tuple[str, ...]:
        """What the scorer is sent, as the spec checks it against the family: video and/or audio, else images."""
        media = (("video",) if self.frameStride is not None or self.frameCount is not None else ()) + (
            ("audio",) if self.audio else ())
        return media or ("image",)

    @model_validator(mode="after")
    def _check(self) -> RemoteParams:
        if self.frameStride is not None and self.frameCount is not None:
            raise FieldProblem("frameCount", self.frameCount, "set frameStride or frameCount, not both")
        return self


def media_request(params: RemoteParams):
    """The `MediaRequest` of the params (None: the scorer is sent images, as before the media fields)."""
    from omnirl.reward.remote import MediaRequest

    media = MediaRequest(params.frameStride, params.frameCount, params.audio)
    return media if media.modalities else None


def build_http(spec, params: RemoteParams, *, threads: int, field: str):
    """An `HTTPScorer` of `spec.url`."""
    from omnirl.reward.remote import HTTPScorer

    return HTTPScorer(spec.name, spec.url, timeout_s=spec.timeoutSeconds, max_retries=params.maxRetries, field=field,
                      media=media_request(params))


def build_grpc(spec, params: RemoteParams, *, threads: int, field: str):
    """A `GRPCScorer` of `spec.url` (host:port)."""
    from omnirl.reward.remote import GRPCScorer

    return GRPCScorer(spec.name, spec.url, timeout_s=spec.timeoutSeconds, max_retries=params.maxRetries, field=field,
                      media=media_request(params))


def check_endpoint(spec, params: RemoteParams, field: str, strict: bool) -> None:
    """`remote.check_remote`: the url answers an empty request of the scorer protocol."""
    from omnirl.reward.remote import check_remote

    check_remote(field, spec.kind, spec.url, spec.timeoutSeconds, strict=strict)


# images by default; videos and sounds when the params say (RemoteParams.reads, which the spec checks)
HTTP = register_kind(RewardKind(name="http", params=RemoteParams, build=build_http, runs="remote", endpoint="http",
                                check_endpoint=check_endpoint))
GRPC = register_kind(RewardKind(name="grpc", params=RemoteParams, build=build_grpc, runs="remote", endpoint="grpc",
                                check_endpoint=check_endpoint))
