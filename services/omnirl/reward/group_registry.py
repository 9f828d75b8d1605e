"""RewardSpec of a group kind → group scorer, apart from `registry` so that the controller, which
runs the group scorers, never imports the per-sample scorers (an import-linter contract)."""

from __future__ import annotations

from omnirl.api.spec import RewardSpec
from omnirl.reward.base import GroupScorer
from omnirl.reward.kinds import get_kind


def build_group_scorer(spec: RewardSpec) -> GroupScorer:
    """Construct the group-level scorer a `RewardSpec` of a group kind names (its kind's `build`).

    Raises:
        ValueError: a kind that is not group-level.
    """
    kind = get_kind(spec.kind)
    if kind.runs != "group":
        raise ValueError(f"reward {spec.name!r}: kind {spec.kind!r} is not a group-level scorer")
    return kind.build(spec, spec.typed_params(), threads=1, field=f"spec.reward[{spec.name}]")
