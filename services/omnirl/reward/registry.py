"""RewardSpec → scorer."""

from __future__ import annotations

from omnirl.api.spec import RewardSpec
from omnirl.reward.base import GroupScorer, Scorer


def build_scorer(spec: RewardSpec) -> Scorer:
    """Construct the scorer a `RewardSpec` names.

    Raises:
        ValueError: an unknown parameter for the scorer kind, or a kind this build does not ship.
    """
    params = dict(spec.params)
    if spec.kind == "ocr":
        from omnirl.reward.ocr import OCRScorer

        _only(spec, params, {"alphabet", "threads", "batch_size"})
        return OCRScorer(alphabet=str(params.get("alphabet", "0123456789")), threads=int(params.get("threads", 1)),
                         batch_size=int(params.get("batch_size", 64)))
    if spec.kind == "jpeg":
        from omnirl.reward.jpeg import JPEGCompressibilityScorer

        _only(spec, params, {"quality"})
        return JPEGCompressibilityScorer(quality=int(params.get("quality", 95)))
    if spec.kind == "http":
        from omnirl.reward.http import HTTPScorer

        _only(spec, params, set())
        return HTTPScorer(spec.name, spec.url, timeout_s=spec.timeoutSeconds)
    raise ValueError(
        f"reward {spec.name!r}: kind {spec.kind!r} is not available in this build; use ocr, jpeg or http "
        "(an HTTP scorer can front a gRPC model or a VLM judge)"
    )


def build_group_scorer(spec: RewardSpec) -> GroupScorer:
    """Construct the group-level scorer a `RewardSpec` of a group kind names.

    Raises:
        ValueError: an unknown parameter, or a kind that is not group-level.
    """
    if spec.kind == "pairwise-contrast":
        from omnirl.reward.pairwise import PairwiseContrastScorer

        _only(spec, dict(spec.params), set())
        return PairwiseContrastScorer()
    raise ValueError(f"reward {spec.name!r}: kind {spec.kind!r} is not a group-level scorer")


def _only(spec: RewardSpec, params: dict, allowed: set[str]) -> None:
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ValueError(f"reward {spec.name!r} (kind {spec.kind}): unknown params {unknown}; allowed: {sorted(allowed)}")
