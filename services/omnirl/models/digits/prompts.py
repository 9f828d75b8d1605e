"""Deterministic OCR prompt sets for the digits task (Flow-GRPO OCR prompt format).

`make_prompt_sets(seed)` draws distinct 3–5 digit numbers without a leading zero (length uniform
over {3, 4, 5}): a training pool of 64 and 256 held-out numbers disjoint from it. The files
shipped in examples/prompts/ are `write_prompt_files(..., seed=0)`.

`make_train_pool` draws a larger training pool (1024 numbers, same length law) that is disjoint
from the held-out set: with only 64 training numbers a policy partly memorises them (train
reward well above held-out). Shipped as examples/prompts/ocr-train-pool.txt
(`write_train_pool`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

PROMPT_TEMPLATE = 'A sign that says "{}"'
TRAIN_SIZE = 64
HELDOUT_SIZE = 256
TRAIN_FILE = "ocr-train.txt"
HELDOUT_FILE = "ocr-heldout.txt"
POOL_SIZE = 1024
POOL_FILE = "ocr-train-pool.txt"


def _numbers(rng: np.random.Generator, count: int, exclude: frozenset[str] = frozenset()) -> list[str]:
    seen: set[str] = set(exclude)
    out: list[str] = []
    while len(out) < count:
        n = int(rng.integers(3, 6))
        number = str(int(rng.integers(10 ** (n - 1), 10**n)))
        if number not in seen:
            seen.add(number)
            out.append(number)
    return out


def make_prompt_sets(seed: int = 0) -> tuple[list[str], list[str]]:
    """(train, heldout): 64 and 256 prompts ``A sign that says "NNNN"``, numbers disjoint, 3–5 digits."""
    numbers = _numbers(np.random.default_rng(seed), TRAIN_SIZE + HELDOUT_SIZE)
    prompts = [PROMPT_TEMPLATE.format(n) for n in numbers]
    return prompts[:TRAIN_SIZE], prompts[TRAIN_SIZE:]


def write_prompt_files(out_dir: str | Path, seed: int = 0) -> tuple[Path, Path]:
    """Write ocr-train.txt and ocr-heldout.txt (one prompt per line) into `out_dir`; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, heldout = make_prompt_sets(seed)
    paths = (out / TRAIN_FILE, out / HELDOUT_FILE)
    for path, prompts in zip(paths, (train, heldout), strict=True):
        path.write_text("\n".join(prompts) + "\n")
    return paths


def make_train_pool(size: int = POOL_SIZE, seed: int = 1, heldout_seed: int = 0) -> list[str]:
    """`size` training prompts with distinct numbers, none in `make_prompt_sets(heldout_seed)`'s held-out set.

    Raises:
        ValueError: size outside [1, 4096] (3-digit numbers run out well before the 99 000 possible).
    """
    if not 1 <= size <= 4096:
        raise ValueError(f"size must be in [1, 4096], got {size}")
    heldout = frozenset(_number(p) for p in make_prompt_sets(heldout_seed)[1])
    return [PROMPT_TEMPLATE.format(n) for n in _numbers(np.random.default_rng(seed), size, exclude=heldout)]


def write_train_pool(out_dir: str | Path, size: int = POOL_SIZE, seed: int = 1) -> Path:
    """Write `make_train_pool(size, seed)` to OUT_DIR/ocr-train-pool.txt (one prompt per line); returns the path."""
    path = Path(out_dir) / POOL_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(make_train_pool(size, seed)) + "\n")
    return path


def _number(prompt: str) -> str:
    return prompt.split('"')[1]
