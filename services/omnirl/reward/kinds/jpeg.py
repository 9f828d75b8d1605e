"""`kind: jpeg`: JPEG compressibility (DDPO), scored in the reward workers (`omnirl.reward.jpeg`)."""

from __future__ import annotations

from pydantic import Field

from omnirl.api._base import SpecModel
from omnirl.scorers.kinds import RewardKind, register_kind


class JPEGParams(SpecModel):
    """`kind: jpeg`: JPEG compressibility (DDPO)."""

    quality: int = Field(95, ge=1, le=95, description="JPEG quality (DDPO used 95).")


def build(spec, params: JPEGParams, *, threads: int, field: str):
    """`JPEGCompressibilityScorer` at `params.quality`."""
    from omnirl.reward.jpeg import JPEGCompressibilityScorer

    return JPEGCompressibilityScorer(quality=params.quality)


KIND = register_kind(RewardKind(name="jpeg", params=JPEGParams, build=build))
