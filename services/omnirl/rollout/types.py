"""What goes into and comes out of the rollout engine."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class SampleRequest:
    """One sample to denoise.

    Attributes:
        sample_id: stable id `{step}:{prompt}:{index}` (docs/architecture.md §4, ids); the exactly-once key.
        prompt: the prompt text (carried for reward scorers and logs only).
        prompt_ids: token ids from the controller; they reach the model unchanged.
        seed: per-sample noise seed; the same seed gives the same sample in any batch.
        num_steps: denoising steps.
        window: indices of the stochastic (recorded, trained) steps; empty means pure ODE.
        noise_level: SDE noise level a inside the window.
        sde_type: "sde" or "cps".
        shift: σ-grid shift override (`ModelAdapter.sigma_grid`); None = the family's own grid.
        guidance_scale: CFG scale (1 = off); part of the batching key.
        resolution: image (height, width) in pixels (`model.resolutions`); None = the adapter's
            default. Sets the latent shape, so samples of different sizes share a forward only
            under packed batching.
        meta: passed through to the result (step, group id, kind, attempt...).
        cohort: the `HeldOutCohort` id of a held-out sample: the engine denoises a cohort's samples together
            and with nothing else; None for every other sample.
    """

    sample_id: str
    prompt: str
    prompt_ids: tuple[int, ...]
    seed: int
    num_steps: int
    window: tuple[int, ...] = ()
    noise_level: float = 0.7
    sde_type: str = "sde"
    shift: float | None = None
    guidance_scale: float = 1.0
    resolution: tuple[int, int] | None = None
    meta: dict = field(default_factory=dict)
    cohort: str | None = None


@dataclass
class SampleResult:
    """A finished sample and its trajectory (everything fp32 unless noted).

    Attributes:
        request: the request it answers.
        x0: final latent `[C, H, W]`.
        image: decoded image `[H', W', 3]` uint8.
        latents: latents at the window steps, `[W+1, C, H, W]`: `latents[j]` is the input of
            window step j and `latents[j+1]` its output (the window is contiguous). `[0, ...]`
            when the window is empty.
        log_probs: `[W]` log-prob of each window transition under the rollout policy (mean over
            latent elements, docs/architecture.md §4).
        sigmas: `[W+1]` σ at `latents[j]`.
        policy_version: weights version that produced the sample.
        steps_run: number of denoiser forwards this sample took part in.
        media: a multi-modal family's decoded sample (`omnirl.transfer.media`: `video`, `audio`, …); None for an
            image family. `image` is then its poster (the frames side by side).
    """

    request: SampleRequest
    x0: torch.Tensor
    image: torch.Tensor
    latents: torch.Tensor
    log_probs: torch.Tensor
    sigmas: torch.Tensor
    policy_version: int
    steps_run: int
    media: dict[str, torch.Tensor] | None = None
