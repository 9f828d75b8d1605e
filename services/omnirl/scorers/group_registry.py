"""RewardSpec of a group kind → group scorer, apart from `reward/registry.py` (the per-sample scorers):
the controller runs the group scorers and never imports the reward role's package (an import-linter contract).
A group kind's module is imported by name (`scorers/kinds.py::get_kind`): it imports only `omnirl.api` and,
inside its `build`, its scorer from `omnirl.scorers`."""

from __future__ import annotations

from omnirl.api.spec import RewardSpec
from omnirl.scorers.base import GroupScorer
from omnirl.scorers.kinds import get_kind


def build_group_scorer(spec: RewardSpec) -> GroupScorer:
    """Construct the group-level scorer a `RewardSpec` of a group kind names (its kind's `build`).

    Raises:
        ValueError: a kind that is not group-level.
    """
    kind = get_kind(spec.kind)
    if kind.runs != "group":
        raise ValueError(f"reward {spec.name!r}: kind {spec.kind!r} is not a group-level scorer")
    return kind.build(spec, spec.typed_params(), threads=1, field=f"spec.reward[{spec.name}]")
