"""Prompts: read once, tokenized once, drawn in a seeded order whose position is checkpointed."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omnirl.api.seeds import derive


def numbered_prompts(path: str | Path, what: str = "spec.data.trainPrompts / validationPrompts") -> list[tuple[int, str]]:
    """(1-based line number, prompt) of every non-blank line of a prompt file, stripped.

    Lines end at "\n" only (a "\r" before it is stripped), so the numbers are an editor's, `grep -n`'s
    and `wc -l`'s: `str.splitlines` also split at a form feed or U+2028 inside a line, cutting one prompt
    in two and numbering every later line one too far. A UTF-8 byte-order mark (a Windows editor's) is
    not part of the first prompt.

    Args:
        what: the field or flag the path came from (`spec.data.trainPrompts`, `--prompts`), named in errors.
    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: it is a directory, cannot be read, is not UTF-8 text (naming the line and the byte),
            or holds no prompt.
    """
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{what}: {p} is a directory; pass a file with one prompt per line")
    if not p.exists():
        raise FileNotFoundError(f"{what}: prompt file {p} not found")
    try:
        raw = p.read_bytes()
    except OSError as err:
        raise ValueError(f"{what}: cannot read {p}: {err}") from err
    try:
        lines = raw.decode("utf-8-sig").split("\n")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise ValueError(f"{what}: {p} line {line} is not UTF-8 text (byte {raw[err.start]:#04x}: {err.reason}); "
                         "save the file as UTF-8, or fix or remove that line") from err
    numbered = [(n, line.strip()) for n, line in enumerate(lines, 1) if line.strip()]
    if not numbered:
        raise ValueError(f"{what}: prompt file {p} has no prompts (one prompt per line expected)")
    return numbered


def read_prompts(path: str | Path, what: str = "spec.data.trainPrompts / validationPrompts") -> list[str]:
    """Non-empty lines of a prompt file, stripped; errors as `numbered_prompts`."""
    return [text for _, text in numbered_prompts(path, what)]


def check_prompts(path: str | Path, tokenize: Callable[[str], list[int]], what: str,
                  limit: int | None = None) -> list[str]:
    """The prompts of a file (its first `limit`), each tokenized once to prove the model takes it:
    the one check `omnirl run` (before any process starts) and `omnirl eval` (before the model loads)
    make, so a bad line is reported with its number instead of failing a role or a sampler later.

    Returns:
        the first `limit` prompts (all when None).
    Raises:
        FileNotFoundError, ValueError: as `numbered_prompts`; ValueError naming `what`, the file and
            the line of a prompt the tokenizer refuses, with the tokenizer's reason.
    """
    numbered = numbered_prompts(path, what)[:limit]
    for n, text in numbered:
        try:
            tokenize(text)
        except ValueError as err:
            raise ValueError(f"{what}: {path} line {n}: {err}; fix or remove that line") from err
    return [text for _, text in numbered]


@dataclass
class Prompt:
    """A drawn prompt: its index in the file, its text and its token ids."""

    index: int
    text: str
    ids: list[int]


class PromptSource:
    """Draws prompts epoch by epoch in a seeded shuffled order.

    Args:
        prompts: prompt lines.
        tokenize: text → token ids (the model adapter's; called once per prompt, here).
        seed: the job seed; epoch e's order is shuffled by `derive(seed, "prompts", draw=e)`.
        shuffle: shuffle each epoch, else file order.
        position: (epoch, offset) to resume from.
    """

    def __init__(self, prompts: list[str], tokenize: Callable[[str], list[int]], *, seed: int, shuffle: bool = True,
                 position: tuple[int, int] = (0, 0)) -> None:
        self.prompts = [Prompt(i, text, list(tokenize(text))) for i, text in enumerate(prompts)]
        self.seed, self.shuffle = seed, shuffle
        self.epoch, self.offset = position
        self._order = self._epoch_order(self.epoch)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.prompts)))
        if self.shuffle:
            random.Random(derive(self.seed, "prompts", draw=epoch)).shuffle(order)
        return order

    def draw(self, n: int) -> list[Prompt]:
        """The next `n` prompts (crossing epoch boundaries)."""
        out = []
        for _ in range(n):
            if self.offset >= len(self._order):
                self.epoch, self.offset = self.epoch + 1, 0
                self._order = self._epoch_order(self.epoch)
            out.append(self.prompts[self._order[self.offset]])
            self.offset += 1
        return out

    def seek(self, position: tuple[int, int]) -> None:
        """Continue from `position` (epoch, offset), as `position` returned it."""
        self.epoch, self.offset = int(position[0]), int(position[1])
        self._order = self._epoch_order(self.epoch)

    @property
    def position(self) -> tuple[int, int]:
        """(epoch, offset) — saved in checkpoints so a resumed job draws the same prompts."""
        return self.epoch, self.offset
