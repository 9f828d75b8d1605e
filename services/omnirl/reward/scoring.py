"""`RewardSet`: a job's per-sample rewards and their weighted sum, with no transport.

The reward role scores each sample through it, and `omnirl eval` scores its held-out samples
through it, so the two report the same reward for the same image. Group-level kinds
(`GROUP_KINDS`) are left out: they run in the controller, which holds whole groups (validation
groups have one sample and get none).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from omnirl.api.spec import GROUP_KINDS, RewardSpec
from omnirl.reward.registry import build_scorer, check_api_keys
from omnirl.scorers.base import Outcome, Scorer, reads_media, score_each, score_media_each


def combine(specs: list[RewardSpec], outcomes: dict[str, Outcome], index: int) -> tuple[float | None, dict[str, float], str]:
    """Weighted sum of one sample's rewards → (reward, or None if a required scorer failed or every
    scorer failed; per name; reason). A sample that no scorer scored fails even when none of them is
    required: its sum would be an empty 0, a reward nobody gave it."""
    total, per_name, reasons = 0.0, {}, []
    for spec in specs:
        outcome = outcomes[spec.name]
        err = outcome.errors.get(index)
        if err is not None:
            reasons.append(err.named(spec.name))
            if spec.required:
                return None, per_name, "; ".join(reasons)
            continue
        per_name[spec.name] = float(outcome.values[index])
        total += spec.weight * per_name[spec.name]
    if specs and not per_name:
        return None, per_name, "; ".join(reasons)
    return total, per_name, "; ".join(reasons)


class RewardSet:
    """The per-sample rewards of `specs` (`spec.reward`), built once.

    Args:
        specs: the job's reward entries; group-level kinds are skipped.
        threads: CPU threads for CPU scorers (`build_scorer`).
    Raises:
        ValueError: a scorer cannot be built (an unset `apiKeyEnv` names `spec.reward[i]`, so pass
            the job's whole list).
    """

    def __init__(self, specs: list[RewardSpec], threads: int = 1) -> None:
        check_api_keys(specs)
        self.specs = [r for r in specs if r.kind not in GROUP_KINDS]
        self.scorers: dict[str, Scorer] = {r.name: build_scorer(r, threads=threads, field=f"spec.reward[{i}]")
                                           for i, r in enumerate(specs) if r.kind not in GROUP_KINDS}

    @property
    def needs_media(self) -> bool:
        """Whether a scorer reads media (video, audio), not just each sample's picture (`base.reads_media`)."""
        return any(reads_media(scorer) for scorer in self.scorers.values())

    def score(self, images: list[np.ndarray], prompts: list[str], sample_ids: list[str],
              media: list[dict[str, np.ndarray]] | None = None) -> list[tuple[float | None, dict[str, float], str]]:
        """`combine`d rewards of n images `[H, W, 3]` uint8 (sizes may differ; a scorer call takes one
        size): per sample (weighted sum or None when a required scorer failed, each reward, reasons).
        `media`: each sample's media as numpy (`transfer.media.to_numpy`), for the scorers that read media
        (`needs_media`); an image sample's picture is `images[i]` all the same (a video's poster)."""
        return self.score_or_hold(images, prompts, sample_ids, media)[0]

    def score_or_hold(self, images: list[np.ndarray], prompts: list[str], sample_ids: list[str],
                      media: list[dict[str, np.ndarray]] | None = None
                      ) -> tuple[list[tuple[float | None, dict[str, float], str]], list[bool]]:
        """`score`, and per sample whether it failed only because a scorer did not answer
        (`ScorerError.unavailable`: every error of a required scorer, or of every scorer when none is
        required, is one): worth scoring again once the scorer is back.

        Raises:
            ValueError: a media scorer without `media` (the caller did not load them: `needs_media`)."""
        if self.needs_media and media is None:
            raise ValueError("these rewards read media (video, audio): pass each sample's media")
        outcomes = {name: score_media_each(scorer, media, prompts, sample_ids) if reads_media(scorer)
                    else self._by_shape(scorer, images, prompts, sample_ids) for name, scorer in self.scorers.items()}
        results = [combine(self.specs, outcomes, i) for i in range(len(images))]
        hold = []
        for i, (reward, _, _) in enumerate(results):
            failed = [(s.required, outcomes[s.name].errors[i]) for s in self.specs if i in outcomes[s.name].errors]
            causes = [e for required, e in failed if required] or [e for _, e in failed]  # none required: all failed
            hold.append(reward is None and bool(causes) and all(e.unavailable for e in causes))
        return results, hold

    def longest_s(self, images: list[np.ndarray]) -> float:
        """The longest `score_or_hold` on `images` can take waiting on remote scorers, seconds: the sum
        of their `longest_call_s` over their calls (one per image shape). In-process scorers count 0:
        their time is the worker's own and stays under `progressDeadlineSeconds`."""
        sizes = list(Counter(image.shape for image in images).values())
        remote = [scorer for scorer in self.scorers.values() if hasattr(scorer, "longest_call_s")]  # http, grpc, vlm
        return sum(scorer.longest_call_s(n) for scorer in remote for n in sizes)

    @staticmethod
    def _by_shape(scorer: Scorer, images: list[np.ndarray], prompts: list[str], sample_ids: list[str]) -> Outcome:
        outcome = Outcome(np.zeros(len(images), dtype=np.float32))
        by_shape: dict[tuple, list[int]] = {}
        for i, image in enumerate(images):
            by_shape.setdefault(image.shape, []).append(i)
        for idx in by_shape.values():
            part = score_each(scorer, np.stack([images[i] for i in idx]), [prompts[i] for i in idx],
                              [sample_ids[i] for i in idx])
            outcome.values[idx] = part.values
            outcome.errors.update({idx[k]: err for k, err in part.errors.items()})
        return outcome
