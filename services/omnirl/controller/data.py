"""Prompts: read once, tokenized once, drawn in a seeded order whose position is checkpointed."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omnirl.api.seeds import derive


def read_prompts(path: str | Path) -> list[str]:
    """Non-empty lines of a prompt file.

    Raises:
        FileNotFoundError: the file does not exist (names the path and the spec field to fix).
        ValueError: the file holds no prompt.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"prompt file {p} not found (spec.data.trainPrompts / validationPrompts)")
    prompts = [line.strip() for line in p.read_text().splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"prompt file {p} has no prompts (one prompt per line expected)")
    return prompts


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
