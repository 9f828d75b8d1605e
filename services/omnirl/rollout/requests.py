"""The wire → engine conversion: one shape for the rollout role and `omnirl eval`.

The rollout role turns each `GenerateRequest` it consumes into engine requests with `sample_requests`;
`omnirl eval` does the same with the held-out requests validation publishes (`api/heldout.py::heldout_request`),
so the two see the same σ grid, the same noise seeds and the same sampler settings.
"""

from __future__ import annotations

from omnirl.api.messages import GenerateRequest
from omnirl.rollout.types import SampleRequest


def sample_requests(req: GenerateRequest, meta: dict | None = None, skip=lambda sample_id: False) -> list[SampleRequest]:
    """The engine requests of a wire request, one per sample not `skip`ped.

    Each carries `meta` plus the request's kind, step and group id (for the result's metadata).
    """
    base = {**(meta or {}), "kind": req.kind, "step": req.step, "group_id": req.group_id}
    return [SampleRequest(
        sample_id=s.sample_id, prompt=req.prompt, prompt_ids=tuple(req.prompt_ids), seed=s.seed,
        num_steps=req.num_steps, window=tuple(req.window), noise_level=req.noise_level, sde_type=req.sde_type,
        shift=req.shift, guidance_scale=req.guidance_scale, meta=dict(base),
        resolution=None if req.resolution is None else (int(req.resolution[0]), int(req.resolution[1])),
    ) for s in req.samples if not skip(s.sample_id)]
