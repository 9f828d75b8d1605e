"""Held-out evaluation: validation's requests through an in-process rollout engine, scored by the
job's weighted rewards.

Prompt i's sample is the one in-run validation draws for prompt i (`heldout_request`: same σ grid,
noise seed `eval_seed(seed, i)`, guidance), so two evaluations of different weights on the same
prompt list are directly comparable, and an eval of a run's checkpoint reproduces that step's
`val_reward_mean` (demo-task.md: the same model moves ±0.03 across noise seeds): exactly, on the
machine the run sampled on with the rollout's torch threads, because the samples are denoised in
validation's batches too (`heldout_cohorts` of `roles.rollout.maxBatchSize` prompts, the job's
`roles.rollout.batching`; `omnirl.rollout.requests`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from omnirl.api.heldout import heldout_cohorts, heldout_request
from omnirl.api.spec import RLJobSpec
from omnirl.models.protocol import ModelAdapter
from omnirl.reward.scoring import RewardSet
from omnirl.rollout.engine import RolloutEngine
from omnirl.rollout.requests import entry_requests
from omnirl.rollout.types import SampleResult
from omnirl.scorers.text import exact_match, text_rewards
from omnirl.transfer.media import to_numpy


@dataclass
class EvalResult:
    """Outcome of `evaluate`.

    Attributes:
        mean_reward: mean of `rewards` (validation's `val_reward_mean`).
        exact_match: fraction of samples whose text every OCR-rule reward read exactly (each one's raw
            score ≥ 1 − 1e-6; `omnirl.scorers.text.exact_match`), None when the job has no such reward
            (validation's `val_exact_match`).
        n: number of samples (= prompts).
        rewards: `[n]` float32 weighted sums of the job's rewards, in prompt order.
        images: n `[H, W, 3]` uint8 arrays in prompt order (widths may differ; a video's poster).
        prompts: the prompts, in order.
        components: per sample, each reward's raw score by name.
        media: a multi-modal family's n media dicts (`omnirl.transfer.media`) in prompt order; None for images.
    """

    mean_reward: float
    exact_match: float | None
    n: int
    rewards: np.ndarray
    images: list[np.ndarray] = field(repr=False)
    prompts: list[str] = field(repr=False)
    components: list[dict[str, float]] = field(default_factory=list, repr=False)
    media: list[dict] | None = field(default=None, repr=False)


class SampleUnscored(RuntimeError):
    """An eval sample no reward result could be computed for; the message names it and the reason."""


def evaluate(
    adapter: ModelAdapter,
    spec: RLJobSpec,
    prompts: list[str],
    *,
    rewards: RewardSet | None = None,
    num_steps: int | None = None,
    seed: int | None = None,
    sampler: Literal["ode", "sde"] = "ode",
    batch_size: int | None = None,
    device: str = "cpu",
) -> EvalResult:
    """Mean weighted reward of `prompts`' held-out samples.

    Args:
        adapter: the model (its σ grid, or the job's `algorithm.sampling.shift` override).
        spec: the job: rewards, σ-grid override, guidance, validation defaults.
        prompts: prompt lines; prompt i gets validation's sample i.
        rewards: the scorers (default `RewardSet(spec.reward)`); their errors propagate.
        num_steps: denoising steps (default `spec.validation.numSteps`).
        seed: noise seed (default `spec.validation.seed`).
        sampler: "ode" (validation's) or "sde" (every step but the last stochastic, see `heldout_request`).
        batch_size: prompts per cohort and the engine's `max_batch_size` (default `roles.rollout.maxBatchSize`,
            validation's).
        device: torch device of the engine.
    Raises:
        ValueError: empty prompts, batch_size < 1, num_steps < 2, unknown sampler.
        SampleUnscored: a sample a required reward could not score (a failed eval is an error, not a low score).
    """
    if not prompts:
        raise ValueError("prompts is empty; pass at least one prompt to evaluate")
    rewards = RewardSet(spec.reward) if rewards is None else rewards
    results = sample_heldout(adapter, spec, prompts, num_steps=num_steps, seed=seed, sampler=sampler,
                             batch_size=batch_size, device=device)
    images = [r.image.numpy() for r in results]
    ids = [r.request.sample_id for r in results]
    media = [r.media if r.media is not None else {} for r in results]
    has_media = any(media)
    scored = rewards.score(images, list(prompts), ids, [to_numpy(m) for m in media] if has_media else None)
    for i, (reward, _, reason) in enumerate(scored):
        if reward is None:
            raise SampleUnscored(f"eval sample {i} ({prompts[i]!r}) could not be scored: {reason}")
    totals = [s[0] for s in scored]
    return EvalResult(
        mean_reward=sum(totals) / len(totals),  # validation's float64 mean of the same numbers
        exact_match=exact_match([s[1] for s in scored], text_rewards(spec.reward)),
        n=len(prompts),
        rewards=np.array(totals, dtype=np.float32),
        images=images,
        prompts=list(prompts),
        components=[s[1] for s in scored],
        media=media if has_media else None,
    )


def sample_heldout(
    adapter: ModelAdapter,
    spec: RLJobSpec,
    prompts: list[str],
    *,
    num_steps: int | None = None,
    seed: int | None = None,
    sampler: Literal["ode", "sde"] = "ode",
    batch_size: int | None = None,
    device: str = "cpu",
) -> list[SampleResult]:
    """The held-out samples of `prompts` (sample ids `eval:{i}`) in prompt order, denoised as a validation
    round is: the same requests, in the same cohorts, through a `RolloutEngine` with the rollout role's
    `maxBatchSize` and `batching` (arguments as `evaluate`'s).

    Raises:
        ValueError: batch_size < 1, num_steps < 2, an unknown sampler.
    """
    size = spec.roles.rollout.maxBatchSize if batch_size is None else batch_size
    if size < 1:
        raise ValueError(f"batch_size ({size}) must be >= 1")
    requests = [heldout_request(spec, i, prompt, adapter.tokenize(prompt), step=0, sample_id=f"eval:{i}", seed=seed,
                                num_steps=num_steps, sampler=sampler) for i, prompt in enumerate(prompts)]
    engine = RolloutEngine(adapter, max_batch_size=size, batching=spec.roles.rollout.batching, device=device)
    for cohort in heldout_cohorts(requests, size):  # through the wire form, as a rollout worker reads it
        for sample in entry_requests(cohort.model_dump()):
            engine.submit(sample)
    index = {req.samples[0].sample_id: i for i, req in enumerate(requests)}
    results: list[SampleResult | None] = [None] * len(prompts)
    for result in engine.run_until_idle():
        results[index[result.request.sample_id]] = result
    return results  # every one is set: the engine returns each sample it was given
