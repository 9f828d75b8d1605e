"""`kind: http` and `kind: grpc`: a scorer server speaking the omnirl scorer protocol (`omnirl.reward.remote`;
serve one with `omnirl scorer serve`)."""

from __future__ import annotations

from pydantic import Field

from omnirl.api._base import SpecModel
from omnirl.reward.kinds import RewardKind, register_kind


class RemoteParams(SpecModel):
    """`kind: http` and `kind: grpc`: a scorer server speaking the omnirl scorer protocol."""

    maxRetries: int = Field(
        2, ge=0, le=10, description="Retries of a batch after a connection error, 408/429/5xx or gRPC UNAVAILABLE."
    )


def build_http(spec, params: RemoteParams, *, threads: int, field: str):
    """An `HTTPScorer` of `spec.url`."""
    from omnirl.reward.remote import HTTPScorer

    return HTTPScorer(spec.name, spec.url, timeout_s=spec.timeoutSeconds, max_retries=params.maxRetries, field=field)


def build_grpc(spec, params: RemoteParams, *, threads: int, field: str):
    """A `GRPCScorer` of `spec.url` (host:port)."""
    from omnirl.reward.remote import GRPCScorer

    return GRPCScorer(spec.name, spec.url, timeout_s=spec.timeoutSeconds, max_retries=params.maxRetries, field=field)


def check_endpoint(spec, params: RemoteParams, field: str, strict: bool) -> None:
    """`remote.check_remote`: the url answers an empty request of the scorer protocol."""
    from omnirl.reward.remote import check_remote

    check_remote(field, spec.kind, spec.url, spec.timeoutSeconds, strict=strict)


HTTP = register_kind(RewardKind(name="http", params=RemoteParams, build=build_http, runs="remote", endpoint="http",
                                check_endpoint=check_endpoint))
GRPC = register_kind(RewardKind(name="grpc", params=RemoteParams, build=build_grpc, runs="remote", endpoint="grpc",
                                check_endpoint=check_endpoint))
