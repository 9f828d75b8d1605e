"""Held-out requests: the one shape of a validation round's and `omnirl eval`'s wire requests.

In-run validation (`controller/validation.py`) publishes `heldout_request`s to the rollout workers;
`omnirl eval` builds the very same requests and runs them through an in-process engine (both turn them
into engine requests with `rollout/requests.py::sample_requests`), so the two see the same σ grid, the
same noise seeds and the same sampler settings. Torch-free and below the roles: the controller builds
them without importing the rollout role.
"""

from __future__ import annotations

from typing import Literal

from omnirl.api.messages import GenerateRequest, HeldOutCohort, SampleSeed
from omnirl.api.seeds import derive
from omnirl.api.spec import RLJobSpec

HELDOUT_SDE_NOISE = 0.7
"""Flow-GRPO's default SDE noise level a, for an `sde` held-out sample of a job without its own."""


def eval_seed(seed: int, index: int) -> int:
    """The noise seed of held-out prompt `index` under validation `seed` (the same in validation
    and `omnirl eval`, so their numbers are directly comparable): `derive(seed, "validation",
    sample=index)` (api/seeds.py)."""
    return derive(seed, "validation", sample=index)


def heldout_request(spec: RLJobSpec, index: int, prompt: str, prompt_ids: list[int], *, step: int, sample_id: str,
                    seed: int | None = None, num_steps: int | None = None,
                    sampler: Literal["ode", "sde"] = "ode") -> GenerateRequest:
    """The request of held-out prompt `index` (group id `val{step}:{index}`, one sample).

    Args:
        spec: the job (σ-grid override `algorithm.sampling.shift`, guidance, validation settings).
        index: the prompt's position in the held-out list (its noise seed is `eval_seed(seed, index)`).
        sample_id: the sample's id (validation: `val{step}:{index}:{nonce}`).
        seed: noise seed; default `spec.validation.seed`.
        num_steps: denoising steps; default `spec.validation.numSteps`.
        sampler: "ode" (deterministic, what validation runs) or "sde": every step but the last
            stochastic, with the job's Flow-GRPO noise level when its sdeType is `sde`
            (a CPS noise level means something else), else `HELDOUT_SDE_NOISE`.
    Raises:
        ValueError: an unknown sampler or num_steps < 2 (an SDE window needs a step before the last).
    """
    if sampler not in ("ode", "sde"):
        raise ValueError(f"sampler must be 'ode' or 'sde', got {sampler!r}")
    v, s = spec.validation, spec.algorithm.sampling
    n = v.numSteps if num_steps is None else num_steps
    if n < 2:
        raise ValueError(f"num_steps {n}: must be >= 2 (the last denoising step is never stochastic)")
    window, noise = [], 0.0
    if sampler == "sde":
        g = spec.algorithm.flowGrpo
        window, noise = list(range(n - 1)), g.noiseLevel if g.sdeType == "sde" else HELDOUT_SDE_NOISE
    group = f"val{step}:{index}"
    return GenerateRequest(
        kind="val", step=step, group_id=group, prompt=prompt, prompt_ids=list(prompt_ids),
        samples=[SampleSeed(sample_id=sample_id, seed=eval_seed(v.seed if seed is None else seed, index))],
        num_steps=n, window=window, noise_level=noise, shift=s.shift, guidance_scale=s.guidanceScale,
        resolution=list(spec.model.resolution_for(index)) if spec.model.resolutions else None)

def heldout_cohorts(requests: list[GenerateRequest], size: int) -> list[HeldOutCohort]:
    """`requests` (held-out, in prompt order) as cohorts of `size` consecutive ones (the last may be smaller):
    what validation publishes and `omnirl eval` denoises, `size` = `spec.roles.rollout.maxBatchSize` in both, so
    a cohort's samples of one shape fit one forward. Raises ValueError for size < 1."""
    if size < 1:
        raise ValueError(f"cohort size {size}: must be >= 1")
    chunks = [requests[i : i + size] for i in range(0, len(requests), size)]
    return [HeldOutCohort(cohort_id=chunk[0].samples[0].sample_id, requests=chunk) for chunk in chunks]
