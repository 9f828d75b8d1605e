"""Shared test helpers: a small real digits model (random weights) and requests for it."""

from __future__ import annotations

import torch

from omnirl.models.digits.adapter import DigitsAdapter
from omnirl.models.digits.model import DigitsConfig, DigitsDiT
from omnirl.rollout.types import SampleRequest

PROMPTS = ['A sign that says "123"', 'A sign that says "98765"', 'A sign that says "4071"']


def tiny_adapter(seed: int = 0) -> DigitsAdapter:
    """The real digits DiT at a small width (d 32, depth 2), random weights."""
    torch.manual_seed(seed)
    return DigitsAdapter(DigitsDiT(DigitsConfig(d_model=32, depth=2, heads=2, mlp_ratio=2)))


def requests(adapter: DigitsAdapter, n_per_prompt: int = 3, *, num_steps: int = 6, window=(1, 2),
             prompts: list[str] = PROMPTS) -> list[SampleRequest]:
    """n requests per prompt with distinct seeds and a shared SDE window."""
    out = []
    for p, text in enumerate(prompts):
        ids = tuple(adapter.tokenize(text))
        for i in range(n_per_prompt):
            out.append(SampleRequest(sample_id=f"0:{p}:{i}", prompt=text, prompt_ids=ids, seed=1000 * p + i,
                                     num_steps=num_steps, window=tuple(window), noise_level=0.7))
    return out
