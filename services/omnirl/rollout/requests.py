"""Held-out requests and the wire → engine conversion: one shape for validation and `omnirl eval`.

In-run validation publishes `heldout_request`s to the rollout workers, grouped into `heldout_cohorts`;
`omnirl eval` builds the very same requests and cohorts and runs them through an in-process
`RolloutEngine`. Both paths turn a requests-stream entry into engine requests with `entry_requests`, so
the two see the same σ grid, the same noise seeds, the same sampler settings and the same batches: a
cohort is denoised together and with nothing else (`HeldOutCohort`), so a held-out sample's latents are
bitwise the ones eval computes on the same machine with the same torch threads. Before, each held-out
request travelled alone and joined whatever batch the worker was running when it arrived (one sample's
first step alone, the next three joining it): the fp32 GEMMs of the σ conditioning round differently at
batch size 1, 2-3 and ≥ 4 on the 2-core CPU, the latents moved by up to 5e-7, and a pixel that then
rounded the other way moved a JPEG-size reward (`e2e/test_reward_judges.py`, issue 36).
"""

from __future__ import annotations

from typing import Literal

from omnirl.api.messages import GenerateRequest, HeldOutCohort, SampleSeed
from omnirl.api.seeds import derive
from omnirl.api.spec import RLJobSpec
from omnirl.rollout.types import SampleRequest

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


def entry_requests(entry: dict, meta: dict | None = None, skip=lambda sample_id: False) -> list[SampleRequest]:
    """The engine requests of one requests-stream entry: a `GenerateRequest` (`sample_requests`) or a
    `HeldOutCohort` (each of its requests', in order, marked with the cohort's id). `meta` and `skip` as in
    `sample_requests`. Raises pydantic.ValidationError for an entry that is neither."""
    if entry.get("type") == "cohort":
        cohort = HeldOutCohort.model_validate(entry)
        return [s for req in cohort.requests for s in sample_requests(req, meta, skip, cohort=cohort.cohort_id)]
    return sample_requests(GenerateRequest.model_validate(entry), meta, skip)


def sample_requests(req: GenerateRequest, meta: dict | None = None, skip=lambda sample_id: False,
                    cohort: str | None = None) -> list[SampleRequest]:
    """The engine requests of a wire request, one per sample not `skip`ped.

    Each carries `meta` plus the request's kind, step and group id (for the result's metadata), and
    `cohort` (the `HeldOutCohort` it travelled in, None for a lone request).
    """
    base = {**(meta or {}), "kind": req.kind, "step": req.step, "group_id": req.group_id}
    return [SampleRequest(
        sample_id=s.sample_id, prompt=req.prompt, prompt_ids=tuple(req.prompt_ids), seed=s.seed,
        num_steps=req.num_steps, window=tuple(req.window), noise_level=req.noise_level, sde_type=req.sde_type,
        shift=req.shift, guidance_scale=req.guidance_scale, meta=dict(base),
        resolution=None if req.resolution is None else (int(req.resolution[0]), int(req.resolution[1])),
        cohort=cohort,
    ) for s in req.samples if not skip(s.sample_id)]
