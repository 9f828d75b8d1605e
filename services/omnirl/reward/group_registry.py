"""RewardSpec of a group kind → group scorer, apart from `registry` so that the controller, which
runs the group scorers, never imports the per-sample scorers (an import-linter contract)."""

from __future__ import annotations

from omnirl.api.spec import RewardSpec
from omnirl.reward.base import GroupScorer


def build_group_scorer(spec: RewardSpec) -> GroupScorer:
    """Construct the group-level scorer a `RewardSpec` of a group kind names.

    Raises:
        ValueError: a kind that is not group-level.
    """
    if spec.kind == "pairwise-contrast":
        from omnirl.reward.pairwise import PairwiseContrastScorer

        return PairwiseContrastScorer()
    raise ValueError(f"reward {spec.name!r}: kind {spec.kind!r} is not a group-level scorer")
