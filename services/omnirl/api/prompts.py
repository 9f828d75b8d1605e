"""Prompt-text rules shared by the model adapters and the reward scorers.

`api` is the bottom layer (docs/architecture.md §1), so both `omnirl.models` and `omnirl.reward` import the
quoted-text rule from here instead of keeping two copies that could drift apart.
"""

from __future__ import annotations


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
