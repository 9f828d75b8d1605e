"""The wire → engine conversion: one shape for the rollout role and `omnirl eval`.

The rollout role turns each requests-stream entry it consumes into engine requests with `entry_requests`;
`omnirl eval` does the same with the held-out requests and cohorts validation publishes
(`api/heldout.py::heldout_request`, `heldout_cohorts`), so the two see the same σ grid, the same noise seeds, the
same sampler settings and the same batches: a cohort is denoised together and with nothing else (`HeldOutCohort`),
so a held-out sample's latents are bitwise the ones eval computes on the same machine with the same torch threads
(a lone held-out request joining whatever batch the worker ran moved the fp32 GEMMs' rounding, and a pixel that
rounded the other way moved a JPEG-size reward).
"""

from __future__ import annotations

from omnirl.api.messages import GenerateRequest, HeldOutCohort
from omnirl.rollout.types import SampleRequest


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
