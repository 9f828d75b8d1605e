"""A character-level tokenizer for the built-in digits model.

Id 0 is padding; ids 1..len(alphabet) are the alphabet's characters in order. The prompt's token
ids are produced once (by the controller) and then travel unchanged (docs/concepts.md, "One job, four roles").
"""

from __future__ import annotations

from omnirl.api.prompts import target_text

__all__ = ["PAD_ID", "CharTokenizer", "target_text"]

PAD_ID = 0


class CharTokenizer:
    """Characters ↔ ids: 0 = pad, 1.. = `alphabet` characters.

    Args:
        alphabet: the allowed characters, each once (default the ten digits).
        max_length: the longest text `encode` accepts (8: the digits model draws at most 8 slots).
    Raises:
        ValueError: empty alphabet, repeated characters or `max_length` < 1.
    """

    def __init__(self, alphabet: str = "0123456789", max_length: int = 8) -> None:
        if not alphabet:
            raise ValueError("alphabet must not be empty")
        if len(set(alphabet)) != len(alphabet):
            raise ValueError(f"alphabet {alphabet!r} repeats a character; list each character once")
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        self.alphabet = alphabet
        self.max_length = max_length
        self._ids = {ch: i + 1 for i, ch in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        """Number of ids including pad: len(alphabet) + 1."""
        return len(self.alphabet) + 1

    def encode(self, text: str) -> list[int]:
        """Text → ids (no padding), one id per character.

        Raises:
            ValueError: a character outside the alphabet (named with the alphabet), an empty text,
                or a text longer than `max_length`.
        """
        if not text:
            raise ValueError("text is empty; the digits model needs at least one character to draw")
        if len(text) > self.max_length:
            raise ValueError(
                f"text {text!r} has {len(text)} characters; at most {self.max_length} are supported"
            )
        ids = []
        for ch in text:
            if ch not in self._ids:
                raise ValueError(
                    f"character {ch!r} in {text!r} is not in the tokenizer alphabet {self.alphabet!r}"
                )
            ids.append(self._ids[ch])
        return ids

    def decode(self, ids: list[int]) -> str:
        """Ids → text; pad ids (0) are skipped.

        Raises:
            ValueError: an id outside [0, vocab_size).
        """
        chars = []
        for i in ids:
            i = int(i)
            if i == PAD_ID:
                continue
            if not 0 < i < self.vocab_size:
                raise ValueError(f"token id {i} is outside [0, {self.vocab_size}) for alphabet {self.alphabet!r}")
            chars.append(self.alphabet[i - 1])
        return "".join(chars)
