"""Text-matching rules for the OCR reward (Flow-GRPO, Liu et al. 2025, "Flow-GRPO: Training Flow
Matching Models via Online RL", OCR task: reward = 1 − min(Levenshtein, len(target)) / len(target),
with distance 0 when the target appears inside the reading)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from omnirl.api.prompts import target_text
from omnirl.api.spec import RewardSpec
from omnirl.scorers.base import ScorerError

__all__ = ["exact_match", "levenshtein", "ocr_reward", "read_target", "target_text", "text_rewards"]


def read_target(prompt: str, sample_id: str, who: str = "") -> str:
    """The text sample `sample_id` must show: its prompt's quoted text (`target_text`), for a scorer that reads it.

    Args:
        who: the scorer's name, prefixed to the message (`"vlm: bad prompt: …"`; empty: none).
    Raises:
        ScorerError: of `sample_id`, a prompt `target_text` refuses, or one whose text is empty or only spaces
            (the message says to quote the text, e.g. "2048").
    """
    prefix = f"{who}: " if who else ""
    try:
        target = target_text(prompt)
    except (TypeError, ValueError) as err:
        raise ScorerError(sample_id, f"{prefix}bad prompt: {err}") from err
    if not target.replace(" ", ""):
        raise ScorerError(sample_id, f"{prefix}prompt {prompt!r} has no text to read; quote it, e.g. \"2048\"")
    return target


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions, each cost 1) by dynamic programming."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def ocr_reward(target: str, reading: str) -> float:
    """Flow-GRPO's OCR reward of one reading.

    Both strings are lower-cased and stripped of spaces; d = 0 if the target is a substring of
    the reading, else min(Levenshtein(reading, target), len(target)); reward = 1 − d / len(target).

    Raises:
        ValueError: the target is empty after removing spaces (nothing to read).
    """
    target = target.replace(" ", "").lower()
    reading = reading.replace(" ", "").lower()
    if not target:
        raise ValueError("OCR target text is empty; quote the text to draw in the prompt")
    distance = 0 if target in reading else min(levenshtein(reading, target), len(target))
    return 1.0 - distance / len(target)


def text_rewards(specs: Sequence[RewardSpec]) -> list[str]:
    """Names of the rewards scored with `ocr_reward`: those whose kind's `reads_text(params)` says so (kind `ocr`,
    and `vlm` with template `read-text`)."""
    from omnirl.scorers.kinds import get_kind

    return [s.name for s in specs if get_kind(s.kind).reads_text(s.typed_params())]


def exact_match(components: Sequence[Mapping[str, float]], names: Sequence[str]) -> float | None:
    """Fraction of samples whose text every OCR-rule reward read exactly (`val_exact_match`).

    It looks at each reward's raw score, not the weighted sum: the sum of an OCR reward and another
    one reaches 1 without an exact reading (OCR 0.67 + 0.5 x 0.67), and with a weight below 1 never.

    Args:
        components: per sample, each reward's raw score by name (a failed non-required one absent).
        names: the OCR-rule rewards (`text_rewards`).
    Returns:
        The fraction in [0, 1] of samples with every reward of `names` present and >= 1 - 1e-6;
        None when `names` or `components` is empty (no text to match: a JPEG or preference job).
    """
    if not names or not components:
        return None
    exact = sum(all(parts.get(name, 0.0) >= 1.0 - 1e-6 for name in names) for parts in components)
    return exact / len(components)
