"""Tests of the held-out evaluation loop and the image grid."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from omnirl.controller.evaluate import evaluate, initial_noise
from omnirl.controller.grid import save_image_grid
from omnirl.models.digits.adapter import load_digits_adapter
from omnirl.models.digits.prompts import make_prompt_sets
from omnirl.reward.ocr import OCRScorer

torch.set_num_threads(1)


class ConstantScorer:
    """Scores every image 1 if it is mostly white, else 0.5; records the calls it got."""

    name = "constant"

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[int, ...], list[str]]] = []

    def score(self, images, prompts, sample_ids):
        self.calls.append((images.shape, list(sample_ids)))
        return np.where(images.mean(axis=(1, 2, 3)) > 128, 1.0, 0.5).astype(np.float32)


def test_evaluate_eight_prompts_with_ocr():
    adapter = load_digits_adapter("builtin")
    prompts = make_prompt_sets(0)[1][:8]
    result = evaluate(adapter, OCRScorer(), prompts, num_steps=4, seed=0)
    assert result.n == 8 and result.rewards.shape == (8,) and result.rewards.dtype == np.float32
    assert np.all((result.rewards >= 0) & (result.rewards <= 1))
    assert result.mean_reward == pytest.approx(float(result.rewards.mean()))
    assert result.exact_match == pytest.approx(float((result.rewards == 1).mean()))
    widths = [16 * (4 if len(p.split('"')[1]) <= 4 else 8) for p in prompts]
    assert [im.shape for im in result.images] == [(32, w, 3) for w in widths]


def test_evaluate_groups_by_shape_and_is_reproducible():
    adapter = load_digits_adapter("builtin")
    prompts = ['"123"', '"45678"', '"9012"', '"34567"', '"89"']
    scorer = ConstantScorer()
    first = evaluate(adapter, scorer, prompts, num_steps=2, seed=3, batch_size=2)
    shapes = sorted(shape[2] for shape, _ in scorer.calls)
    assert shapes == [64, 64, 128]  # 3 short prompts → batches of 2 + 1; 2 long prompts → one batch
    assert sorted(i for _, ids in scorer.calls for i in ids) == sorted(f"eval:{i}" for i in range(5))
    second = evaluate(adapter, scorer, prompts, num_steps=2, seed=3, batch_size=5)
    for a, b in zip(first.images, second.images, strict=True):
        assert np.array_equal(a, b)  # per-index noise: batching does not change the samples
    assert not torch.equal(initial_noise((1, 4, 4), 0, 1), initial_noise((1, 4, 4), 1, 0))


def test_sde_evaluation_is_batch_independent_and_differs_from_ode():
    adapter = load_digits_adapter("builtin")
    prompts = ['"123"', '"4567"', '"89012"']
    runs = [evaluate(adapter, ConstantScorer(), prompts, num_steps=3, sampler="sde", batch_size=b) for b in (1, 3)]
    ode = evaluate(adapter, ConstantScorer(), prompts, num_steps=3)
    for a, b, o in zip(runs[0].images, runs[1].images, ode.images, strict=True):
        assert np.array_equal(a, b) and not np.array_equal(a, o)
    with pytest.raises(ValueError, match="sampler"):
        evaluate(adapter, ConstantScorer(), prompts, sampler="euler")


def test_evaluate_rejects_empty():
    with pytest.raises(ValueError, match="empty"):
        evaluate(load_digits_adapter("builtin"), ConstantScorer(), [])


def test_save_image_grid_pads_mixed_widths(tmp_path):
    images = [np.zeros((32, 64, 3), np.uint8), np.full((32, 128, 3), 255, np.uint8), np.zeros((32, 64, 3), np.uint8)]
    path = save_image_grid(images, tmp_path / "g" / "grid.png", ncols=2, captions=["a", "b", "c"])
    grid = Image.open(path)
    assert grid.size == (2 * (128 + 2) + 2, 2 * (32 + 12 + 2) + 2)
    with pytest.raises(ValueError, match="uint8"):
        save_image_grid([np.zeros((4, 4, 3), np.float32)], tmp_path / "x.png")
