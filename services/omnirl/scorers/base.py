"""The scorer contract: images + prompts → one float32 reward per sample, or an error.

A scorer never turns a failure into a reward of 0 (docs/rewards.md): bad input, a crashed model or a
non-finite reward raises `ScorerError` naming the sample, and the controller refills or drops the
sample's group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np


class ScorerError(Exception):
    """A sample could not be scored.

    Attributes:
        sample_id: the sample's stable id (``{step}:{prompt}:{index}``), or "" when the whole
            call is malformed (e.g. mismatched list lengths).
        reason: what went wrong and how to fix it.
        unavailable: the scorer did not answer (unreachable, timed out, 408/409/429/5xx after its
            retries), as opposed to answering that this sample cannot be scored; the reward role
            holds such a sample and scores it again when the scorer is back (`RewardService`).
    """

    def __init__(self, sample_id: str, reason: str, *, unavailable: bool = False) -> None:
        super().__init__(f"sample {sample_id!r}: {reason}" if sample_id else reason)
        self.sample_id = sample_id
        self.reason = reason
        self.unavailable = unavailable

    def named(self, name: str) -> str:
        """The reason under the reward's `name`, once: remote scorers already start theirs with it
        (a job's log said "judge: judge: http://… unreachable")."""
        return self.reason if self.reason.startswith(f"{name}: ") else f"{name}: {self.reason}"


@runtime_checkable
class Scorer(Protocol):
    """Anything that scores a batch of images.

    Attributes:
        name: short name used in metrics and configs (``"ocr"``, ``"jpeg_compressibility"``).
    """

    name: str

    def score(self, images: np.ndarray, prompts: list[str], sample_ids: list[str]) -> np.ndarray:
        """Rewards of B samples.

        Args:
            images: `[B, H, W, 3]` uint8 RGB.
            prompts: B prompt lines.
            sample_ids: B sample ids (used in errors).
        Returns:
            `[B]` float32, every value finite.
        Raises:
            ScorerError: a malformed input or a sample that cannot be scored.
        """
        ...


@dataclass
class Outcome:
    """A scorer's result on a batch: values `[B]` float32 (0 where failed) and the failed samples by index."""

    values: np.ndarray
    errors: dict[int, ScorerError] = field(default_factory=dict)

    def fill(self, indices: list[int], inner: Outcome) -> None:
        """Put `inner`, the outcome of this batch's samples `indices` (in that order), in at those indices: each
        one's value, or its error."""
        for k, i in enumerate(indices):
            if k in inner.errors:
                self.errors[i] = inner.errors[k]
            else:
                self.values[i] = inner.values[k]


@runtime_checkable
class PerSampleScorer(Scorer, Protocol):
    """A scorer that reports one score or one error per sample in one call (remote scorers, judges).
    A class that subclasses it gets `score` from its `score_each`."""

    def score_each(self, images: np.ndarray, prompts: list[str], sample_ids: list[str]) -> Outcome:
        """Like `Scorer.score`, but a failed sample is an entry of `Outcome.errors`, not an exception.

        Raises:
            ScorerError: only for a failure of the whole call (sample id ""), e.g. an unreachable server.
        """
        ...

    def score(self, images: np.ndarray, prompts: list[str], sample_ids: list[str]) -> np.ndarray:
        """`[B]` float32 rewards from `score_each`; the first failed sample raises its ScorerError."""
        return raise_first(self.score_each(images, prompts, sample_ids))


def score_each(scorer: Scorer, images: np.ndarray, prompts: list[str], sample_ids: list[str]) -> Outcome:
    """One score or one error per sample from any scorer.

    A `PerSampleScorer` answers per sample itself. Any other scorer scores the batch; when that
    raises for one sample, the samples are scored one at a time so a bad sample fails alone. A
    failure of the whole call (sample id "") fails every sample with that reason.
    """
    each = scorer.score_each if isinstance(scorer, PerSampleScorer) else None
    return _each(scorer, "score", each, images, prompts, sample_ids)


def _each(scorer: Any, method: str, each: Callable[[Any, list[str], list[str]], Outcome] | None, inputs: Any,
          prompts: list[str], sample_ids: list[str]) -> Outcome:
    """`score_each` and `score_media_each` over `scorer`'s batch `method` (`score`: images `[B, ...]`; `score_media`:
    B media dicts): `each` (a scorer's own per-sample answer) when given, else the batch; a batch that raises for
    one sample is scored one sample at a time so a bad sample fails alone, and a failure of the whole call (sample
    id "") fails every sample with that reason."""
    try:
        if each is not None:
            return each(inputs, prompts, sample_ids)
        return Outcome(getattr(scorer, method)(inputs, prompts, sample_ids))
    except ScorerError as err:
        if len(sample_ids) == 1 or not err.sample_id:
            return Outcome(np.zeros(len(sample_ids), np.float32), dict.fromkeys(range(len(sample_ids)), err))
    outcome = Outcome(np.zeros(len(sample_ids), dtype=np.float32))
    for i in range(len(sample_ids)):
        try:
            one = getattr(scorer, method)(inputs[i : i + 1], prompts[i : i + 1], sample_ids[i : i + 1])
            outcome.values[i] = one[0]
        except ScorerError as err:
            outcome.errors[i] = err
    return outcome


@runtime_checkable
class MediaScorer(Protocol):
    """A scorer of decoded video and/or audio (docs/omni.md, "Rewards of media"; OMNI-CONTRACT §4).

    Attributes:
        name: short name used in metrics and configs.
        modalities: the media keys it reads (e.g. ``frozenset({"video", "audio"})``); the reward role hands it
            each sample's media (`omnirl.transfer.media`) instead of an image.
    """

    name: str
    modalities: frozenset[str]

    def score_media(self, media: list[dict[str, np.ndarray]], prompts: list[str], sample_ids: list[str]) -> np.ndarray:
        """Rewards of B samples.

        Args:
            media: B dicts of numpy arrays (`video` uint8 `[T, H, W, 3]`, `audio` float32 `[L]`,
                `audio_sample_rate` int64 0-d, `fps` float32 0-d, `image` uint8 `[H, W, 3]`).
            prompts: B prompt lines. sample_ids: B sample ids (used in errors).
        Returns:
            `[B]` float32, every value finite.
        Raises:
            ScorerError: a malformed input or a sample that cannot be scored.
        """
        ...


def reads_media(scorer: Scorer) -> bool:
    """Whether `scorer` scores media (declares non-empty `modalities` and has `score_media`)."""
    return bool(getattr(scorer, "modalities", None)) and hasattr(scorer, "score_media")


def score_media_each(scorer: MediaScorer, media: list[dict[str, np.ndarray]], prompts: list[str],
                     sample_ids: list[str]) -> Outcome:
    """One score or one error per sample from a media scorer (as `score_each`: a scorer with its own per-sample
    `score_media_each` (a remote one) answers itself; otherwise, when the batch raises for one sample, the samples
    are scored one at a time so a bad sample fails alone)."""
    return _each(scorer, "score_media", getattr(scorer, "score_media_each", None), media, prompts, sample_ids)


def raise_first(outcome: Outcome) -> np.ndarray:
    """`outcome.values`, or the ScorerError of its first failed sample (`Scorer.score` from `score_each`)."""
    if outcome.errors:
        raise outcome.errors[min(outcome.errors)]
    return outcome.values


def check_batch(images: np.ndarray, prompts: list[str], sample_ids: list[str]) -> None:
    """Validate a scorer call: `[B, H, W, 3]` uint8 images and B prompts and B sample ids.

    Raises:
        ScorerError: naming the first sample id (or "" when lengths disagree) and the fix.
    """
    if len(prompts) != len(sample_ids):
        raise ScorerError("", f"got {len(prompts)} prompts but {len(sample_ids)} sample_ids; pass one of each per image")
    first = sample_ids[0] if sample_ids else ""
    if not isinstance(images, np.ndarray):
        raise ScorerError(first, f"images must be a numpy array [B, H, W, 3] uint8, got {type(images).__name__}")
    if images.dtype != np.uint8:
        raise ScorerError(first, f"images must be uint8 [B, H, W, 3], got dtype {images.dtype}; decode latents to uint8 first")
    if images.ndim != 4 or images.shape[3] != 3 or images.shape[1] < 1 or images.shape[2] < 1:
        raise ScorerError(first, f"images must have shape [B, H, W, 3] (RGB), got {list(images.shape)}")
    if images.shape[0] != len(sample_ids):
        raise ScorerError(first, f"got {images.shape[0]} images but {len(sample_ids)} sample_ids")


def check_rewards(rewards: np.ndarray, sample_ids: list[str]) -> np.ndarray:
    """Return `rewards` as float32 `[B]`; a NaN or inf raises ScorerError naming its sample."""
    rewards = np.asarray(rewards, dtype=np.float32)
    bad = np.flatnonzero(~np.isfinite(rewards))
    if bad.size:
        raise ScorerError(sample_ids[bad[0]], f"reward is {rewards[bad[0]]} (not finite)")
    return rewards


@runtime_checkable
class GroupScorer(Protocol):
    """A scorer that sees one prompt's whole group at once (e.g. a pairwise preference model).

    The controller calls it once per complete group of a training step (every member generated
    and scored by the per-sample rewards), before advantages; validation samples are not group-
    scored. A failure fails the whole group (refilled, or dropped after its attempts) when the
    reward is `required`.

    Attributes:
        name: short name used in metrics and configs.
    """

    name: str

    def score_group(self, images: np.ndarray, prompts: list[str], sample_ids: list[str]) -> np.ndarray:
        """Rewards of the G members of one group.

        Args:
            images: `[G, H, W, 3]` uint8 RGB, the group's samples in `sample_ids` order.
            prompts: G prompt lines (one prompt repeated).
            sample_ids: G sample ids.
        Returns:
            `[G]` float32, every value finite.
        Raises:
            ScorerError: the group cannot be scored (sample id "" when no single member is at fault).
        """
        ...
