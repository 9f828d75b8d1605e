"""Prompt-text rules shared by the model adapters and the reward scorers.

`api` is the bottom layer (docs/architecture.md §1), so both `omnirl.models` and `omnirl.reward` import the
quoted-text rule from here instead of keeping two copies that could drift apart.
"""

from __future__ import annotations

import re


def target_text(prompt_line: str) -> str:
    """The text an image for this prompt should show.

    Flow-GRPO's OCR prompts quote the text to draw (``A sign that says "2048"``); the target is the
    part between the first two double quotes. A line without double quotes is taken whole, stripped
    of surrounding whitespace (a bare ``2048`` prompt).

    Args:
        prompt_line: one prompt line.
    Returns:
        The target text (the quoted part is returned verbatim, without stripping).
    Raises:
        TypeError: `prompt_line` is not a str.
        ValueError: the line has exactly one double quote (an unbalanced quote: close it or remove it).
    """
    if not isinstance(prompt_line, str):
        raise TypeError(f"prompt_line must be a str, got {type(prompt_line).__name__}")
    quotes = prompt_line.count('"')
    if quotes == 0:
        return prompt_line.strip()
    if quotes == 1:
        raise ValueError(
            f"prompt {prompt_line!r} has one double quote; quote the target text on both sides, "
            'e.g. A sign that says "2048"'
        )
    return prompt_line.split('"')[1]


MAX_BEEPS = 4
"""The audio+video digits task's largest beep count (`with <k> beeps`, k in 1..4)."""
_BEEPS = re.compile(r"\bwith (\d+) beeps?\b")


def beep_count(prompt_line: str) -> int:
    """k of a prompt of the audio+video digits task, `A sign that says "<number>" with <k> beeps` (`with 1 beep`).

    Raises:
        ValueError: no `with <k> beep(s)` in the line, or k outside 1..4 (the message names the fix).
    """
    found = _BEEPS.search(prompt_line)
    if found is None:
        raise ValueError(f"prompt {prompt_line!r} does not say how many beeps; end it with 'with <k> beeps', k in "
                         f"1..{MAX_BEEPS}, e.g. 'A sign that says \"42\" with 2 beeps'")
    beeps = int(found.group(1))
    if not 1 <= beeps <= MAX_BEEPS:
        raise ValueError(f"prompt {prompt_line!r} asks for {beeps} beeps; the task has 1..{MAX_BEEPS}")
    return beeps
