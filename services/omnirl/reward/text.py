"""Text-matching rules for the OCR reward (Flow-GRPO, Liu et al. 2025, "Flow-GRPO: Training Flow
Matching Models via Online RL", OCR task: reward = 1 − min(Levenshtein, len(target)) / len(target),
with distance 0 when the target appears inside the reading)."""

from __future__ import annotations

from omnirl.api.prompts import target_text

__all__ = ["levenshtein", "ocr_reward", "target_text"]


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
