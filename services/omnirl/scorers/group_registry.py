"""RewardSpec of a group kind → group scorer, apart from `reward/registry.py` (the per-sample scorers):
the controller runs the group scorers and never imports the reward role's package (an import-linter contract)."""

from __future__ import annotations

from omnirl.api.spec import RewardSpec
from omnirl.scorers.base import GroupScorer


def build_group_scorer(spec: RewardSpec) -> GroupScorer:
    """Construct the group-level scorer a `RewardSpec` of a group kind names.

    Raises:
        ValueError: a kind that is not group-level.
    """
    if spec.kind == "pairwise-contrast":
        from omnirl.scorers.pairwise import PairwiseContrastScorer

        return PairwiseContrastScorer()
    raise ValueError(f"reward {spec.name!r}: kind {spec.kind!r} is not a group-level scorer")
