"""`kind: pairwise-contrast`: the built-in group-level toy scorer, run by the controller on whole groups
(`omnirl.scorers.pairwise`)."""

from __future__ import annotations

from omnirl.api._base import SpecModel
from omnirl.scorers.kinds import RewardKind, register_kind


class PairwiseContrastParams(SpecModel):
    """`kind: pairwise-contrast`: the built-in group-level test scorer; no parameters."""


def build(spec, params: PairwiseContrastParams, *, threads: int, field: str):
    """A `PairwiseContrastScorer` (a `GroupScorer`)."""
    from omnirl.scorers.pairwise import PairwiseContrastScorer

    return PairwiseContrastScorer()


KIND = register_kind(RewardKind(name="pairwise-contrast", params=PairwiseContrastParams, build=build, runs="group"))
