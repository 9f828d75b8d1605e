"""Prompts of the audio+video digits task: `A sign that says "<number>" with <k> beeps` (`with 1 beep`).

`prompt_sets(seed)` draws distinct numbers of 2–4 digits without a leading zero (length uniform over
{2, 3, 4}) and a beep count k uniform over 1..4 for each: a training pool of `POOL_SIZE` and
`HELDOUT_SIZE` held-out prompts whose numbers are not in the pool. The files shipped in
examples/prompts/ are `write_prompt_files(examples/prompts, seed=0)`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from omnirl.api.prompts import beep_count as parse_beeps
from omnirl.models.avdigits.media import MAX_BEEPS, MAX_DIGITS, MIN_DIGITS

__all__ = ["make_prompt", "parse_beeps", "prompt_sets", "write_prompt_files"]

POOL_SIZE = 1024
HELDOUT_SIZE = 128
POOL_FILE = "avdigits-train-pool.txt"
HELDOUT_FILE = "avdigits-heldout.txt"


def make_prompt(number: str, beeps: int) -> str:
    """`A sign that says "<number>" with <k> beeps` (`with 1 beep` for k = 1)."""
    return f'A sign that says "{number}" with {beeps} beep{"" if beeps == 1 else "s"}'


def _numbers(rng: np.random.Generator, count: int, exclude: frozenset[str] = frozenset()) -> list[str]:
    seen, out = set(exclude), []
    while len(out) < count:
        n = int(rng.integers(MIN_DIGITS, MAX_DIGITS + 1))
        number = str(int(rng.integers(10 ** (n - 1), 10**n)))
        if number not in seen:
            seen.add(number)
            out.append(number)
    return out


def prompt_sets(seed: int = 0) -> tuple[list[str], list[str]]:
    """(training pool, held-out): `POOL_SIZE` and `HELDOUT_SIZE` prompts, no number in both."""
    rng = np.random.default_rng(seed)
    heldout = _numbers(rng, HELDOUT_SIZE)
    pool = _numbers(rng, POOL_SIZE, exclude=frozenset(heldout))
    beeps = rng.integers(1, MAX_BEEPS + 1, size=POOL_SIZE + HELDOUT_SIZE)
    return ([make_prompt(n, int(k)) for n, k in zip(pool, beeps[:POOL_SIZE], strict=True)],
            [make_prompt(n, int(k)) for n, k in zip(heldout, beeps[POOL_SIZE:], strict=True)])


def write_prompt_files(out_dir: str | Path, seed: int = 0) -> tuple[Path, Path]:
    """Write the training pool and the held-out prompts (one per line) into `out_dir`; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pool, heldout = prompt_sets(seed)
    paths = (out / POOL_FILE, out / HELDOUT_FILE)
    for path, prompts in zip(paths, (pool, heldout), strict=True):
        path.write_text("\n".join(prompts) + "\n")
    return paths
