"""Held-out evaluation: sample each prompt with the deterministic ODE sampler and score it.

Every prompt index has its own fixed initial noise (seeded by (seed, index)), so two evaluations
of different weights on the same prompt list are directly comparable (demo-task.md: the same model
moves ±0.03 across noise seeds).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import torch

from omnirl.algorithms import ode_step, sde_step, sigma_schedule
from omnirl.api.seeds import derive
from omnirl.models.protocol import ModelAdapter
from omnirl.reward.base import Scorer


@dataclass
class EvalResult:
    """Outcome of `evaluate`.

    Attributes:
        mean_reward: mean of `rewards`.
        exact_match: fraction of samples with reward == 1.
        n: number of samples (= prompts).
        rewards: `[n]` float32, in prompt order.
        images: n `[H, W, 3]` uint8 arrays in prompt order (widths may differ).
        prompts: the prompts, in order.
    """

    mean_reward: float
    exact_match: float
    n: int
    rewards: np.ndarray
    images: list[np.ndarray] = field(repr=False)
    prompts: list[str] = field(repr=False)


def eval_seed(seed: int, index: int) -> int:
    """The torch generator seed of prompt `index` under eval `seed` (also used by in-run validation,
    whose rollout engine draws `torch.randn(shape)` from a generator with this seed — the same noise):
    `derive(seed, "validation", sample=index)` (api/seeds.py)."""
    return derive(seed, "validation", sample=index)


def initial_noise(shape: tuple[int, ...], seed: int, index: int) -> torch.Tensor:
    """The fixed ε `[*shape]` float32 (CPU) of prompt `index` under eval `seed`."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(eval_seed(seed, index)))


@torch.no_grad()
def sample_ode(
    adapter: ModelAdapter, prompt_ids: list[list[int]], noise: torch.Tensor, num_steps: int, device: str = "cpu"
) -> torch.Tensor:
    """Integrate the probability-flow ODE from σ = 1 to 0 with `num_steps` Euler steps.

    Args:
        prompt_ids: B prompts' token ids, all with the latent shape of `noise`.
        noise: `[B, C, H, W]` float32 initial latents (σ = 1).
    Returns:
        `[B, H', W', 3]` uint8 images (the adapter's decode).
    """
    cond = adapter.encode(prompt_ids, device=device)
    x = noise.to(device)
    sigmas = sigma_schedule(num_steps).to(device)
    b = x.shape[0]
    for k in range(num_steps):
        sigma, sigma_next = sigmas[k].expand(b), sigmas[k + 1].expand(b)
        x = ode_step(x, adapter.velocity(x, sigma, cond), sigma, sigma_next)
    return adapter.decode(x).cpu()


@torch.no_grad()
def sample_sde(
    adapter: ModelAdapter,
    prompt_ids: list[list[int]],
    generators: list[torch.Generator],
    num_steps: int,
    noise_level: float = 0.7,
    device: str = "cpu",
) -> torch.Tensor:
    """Sample with the Flow-GRPO SDE at every step (as the rollout engine with a full window).

    Each sample draws its initial latent and then one step noise per step from its own CPU
    generator, exactly like `omnirl.rollout.engine`, so the result does not depend on batching.

    Args:
        prompt_ids: B prompts' token ids, all of one latent shape.
        generators: B CPU generators (seeded with `eval_seed`).
        noise_level: the SDE's a (Flow-GRPO default 0.7).
    Returns:
        `[B, H', W', 3]` uint8 images.
    """
    shape = tuple(adapter.latent_shape(prompt_ids[0]))
    cond = adapter.encode(prompt_ids, device=device)
    x = torch.stack([torch.randn(shape, generator=g) for g in generators]).to(device)
    sigmas = sigma_schedule(num_steps).to(device)
    b = x.shape[0]
    for k in range(num_steps):
        sigma, sigma_next = sigmas[k].expand(b), sigmas[k + 1].expand(b)
        noise = torch.stack([torch.randn(shape, generator=g) for g in generators]).to(device)
        x = sde_step(x, adapter.velocity(x, sigma, cond), sigma, sigma_next, noise_level, noise=noise).x_next
    return adapter.decode(x).cpu()


def evaluate(
    adapter: ModelAdapter,
    scorer: Scorer,
    prompts: list[str],
    *,
    num_steps: int = 20,
    seed: int = 0,
    batch_size: int = 64,
    device: str = "cpu",
    sampler: str = "ode",
    noise_level: float = 0.7,
) -> EvalResult:
    """Mean reward of ODE (default) or SDE samples for `prompts` (batched by latent shape).

    Args:
        adapter: the model.
        scorer: the reward (its errors propagate: a failed eval is an error, not a low score).
        prompts: prompt lines.
        num_steps: Euler steps of the ODE sampler.
        seed: noise seed; prompt i always starts from `initial_noise(shape, seed, i)`.
        batch_size: samples per forward pass and per scorer call.
        device: torch device for sampling.
        sampler: "ode" (deterministic Euler, `sample_ode`) or "sde" (every step stochastic,
            `sample_sde`; prompt i's generator is seeded with `eval_seed(seed, i)`).
        noise_level: the SDE's noise level a (sampler "sde" only).
    Raises:
        ValueError: empty prompts, num_steps or batch_size < 1, unknown sampler.
    """
    if sampler not in ("ode", "sde"):
        raise ValueError(f"sampler must be 'ode' or 'sde', got {sampler!r}")
    if not prompts:
        raise ValueError("prompts is empty; pass at least one prompt to evaluate")
    if num_steps < 1 or batch_size < 1:
        raise ValueError(f"num_steps ({num_steps}) and batch_size ({batch_size}) must be >= 1")
    ids = [adapter.tokenize(p) for p in prompts]
    by_shape: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for i, prompt_ids in enumerate(ids):
        by_shape[tuple(adapter.latent_shape(prompt_ids))].append(i)
    images: list[np.ndarray | None] = [None] * len(prompts)
    rewards = np.zeros(len(prompts), dtype=np.float32)
    for shape, indices in by_shape.items():
        for start in range(0, len(indices), batch_size):
            chunk = indices[start : start + batch_size]
            chunk_ids = [ids[i] for i in chunk]
            if sampler == "ode":
                noise = torch.stack([initial_noise(shape, seed, i) for i in chunk])
                batch = sample_ode(adapter, chunk_ids, noise, num_steps, device).numpy()
            else:
                gens = [torch.Generator().manual_seed(eval_seed(seed, i)) for i in chunk]
                batch = sample_sde(adapter, chunk_ids, gens, num_steps, noise_level, device).numpy()
            scores = scorer.score(batch, [prompts[i] for i in chunk], [f"eval:{i}" for i in chunk])
            for k, i in enumerate(chunk):
                images[i], rewards[i] = batch[k], scores[k]
    return EvalResult(
        mean_reward=float(rewards.mean()),
        exact_match=float((rewards == 1.0).mean()),
        n=len(prompts),
        rewards=rewards,
        images=images,
        prompts=list(prompts),
    )
