"""Typed metadata of the TransferQueue's stream entries (msgpack on the wire, docs/architecture.md §3 "Messages").

Streams and who reads them:

| stream | producer → consumer group | entry |
| --- | --- | --- |
| `requests` | controller → `rollout` | `GenerateRequest` (one prompt, G samples), or `HeldOutCohort` (validation) |
| `samples` | rollout → `reward` | `SampleMeta` + trajectory tensors under a key |
| `scores` | reward → `controller` | `ScoreMeta` (points at the sample's tensor key) |
| `control` | controller → `actor`; actor → `controller` | `TrainRequest`; `TrainDone` / `TrainLost` / `RoleFailure` |

`policy_version` has one owner, the actor: it bumps it after each update (`TrainDone`), and
everything else copies it — rollout workers from the weight sync (stamped on `SampleMeta`), the
reward role into `ScoreMeta` (the controller's staleness check reads it there), the controller
from `TrainDone` into the next `TrainRequest` and `kv:actor_state` on a restart.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SampleSeed(_Msg):
    sample_id: str = Field(..., description="Stable id `{step}:{prompt}:{index}` (refills add `r{attempt}`).")
    seed: int = Field(..., description="Noise seed of this sample.")


class GenerateRequest(_Msg):
    """One prompt's group of samples for the rollout workers."""

    type: Literal["generate"] = "generate"
    kind: Literal["train", "val"] = Field(..., description="Training rollout or validation sample.")
    step: int
    group_id: str = Field(..., description="`{step}:{prompt}` (+ `r{attempt}` for refills).")
    prompt: str
    prompt_ids: list[int]
    samples: list[SampleSeed]
    num_steps: int
    window: list[int] = Field(default_factory=list, description="Stochastic step indices; empty = ODE.")
    noise_level: float = 0.0
    sde_type: Literal["sde", "cps"] = "sde"
    shift: float | None = Field(None, description="σ-grid shift override; None = the model family's own grid.")
    guidance_scale: float = 1.0
    resolution: list[int] | None = Field(
        None, description="Image (height, width) in pixels of this group (`model.resolutions`); None = the "
        "adapter's default size (`model.resolution`).")


class HeldOutCohort(_Msg):
    """Held-out requests (one sample each) that the rollout engine denoises together and only together: each
    forward holding one of their samples holds exactly the cohort's samples of its latent shape, in this order,
    at the same denoising step. A validation round is published as cohorts of consecutive prompts, and `omnirl
    eval` runs the same cohorts (`omnirl.rollout.requests.heldout_cohorts`), so a sample's latents do not depend
    on when its request reached a worker or what else the worker was denoising (the fp32 GEMMs of a forward
    round differently at another batch size)."""

    type: Literal["cohort"] = "cohort"
    cohort_id: str = Field(..., description="Unique per round and attempt: the first request's sample id.")
    requests: list[GenerateRequest] = Field(..., min_length=1)


class SampleMeta(_Msg):
    """A finished sample; its trajectory (x0, latents, log_probs, sigmas) is under the entry's tensor key,
    its image alone under `image_key(tensor key)` (`omnirl.transfer.keys`)."""

    sample_id: str
    kind: Literal["train", "val"]
    step: int
    group_id: str
    prompt: str
    prompt_ids: list[int]
    policy_version: int = Field(..., description="Weights version that made the sample (from the weight sync).")
    noise_level: float
    sde_type: str
    worker: str
    generated_at: float = Field(..., description="Unix time, seconds.")
    rollout_seconds: float = Field(..., description="Queue-to-finish time of this sample, seconds.")


class ScoreMeta(_Msg):
    """The rewards of one sample."""

    sample_id: str
    kind: Literal["train", "val"]
    step: int
    group_id: str
    policy_version: int = Field(..., description="The sample's version (SampleMeta's); read for maxStaleness.")
    reward: float | None = Field(None, description="Weighted sum; None when failed.")
    rewards: dict[str, float] = Field(default_factory=dict, description="Per reward name.")
    failed: bool = False
    reason: str = ""
    lost: bool = Field(False, description="Failed because the sample's tensors were gone (expired after "
                       "`tensorTtlSeconds`, or deleted) before it was scored: validation counts it missing.")
    generated_at: float
    scored_at: float


class TrainItem(_Msg):
    sample_id: str
    group_id: str
    prompt_ids: list[int]
    advantage: float
    tensor_key: str
    noise_level: float
    sde_type: str


class TrainRequest(_Msg):
    """A complete batch with advantages for the actor."""

    type: Literal["train"] = "train"
    step: int
    policy_version: int = Field(..., description="Version the actor holds before this update (the last TrainDone's); "
                                                "the actor's new version is this + 1.")
    items: list[TrainItem]
    checkpoint: bool = Field(False, description="Save a checkpoint after this step.")
    controller_state: dict = Field(default_factory=dict, description="Data position etc., saved in the checkpoint.")


class TrainDone(_Msg):
    type: Literal["trained"] = "trained"
    step: int
    policy_version: int = Field(..., description="Version after the update, set by the actor (now on every "
                                                "rollout worker); the controller adopts it.")
    metrics: dict[str, float]
    checkpoint: str | None = None


class TrainLost(_Msg):
    """The actor did not train step `step`: the tensors of `samples` were gone when it read the batch
    (expired after `spec.transferQueue.tensorTtlSeconds`, or deleted). The controller regenerates their
    groups (its refill path) and hands the step again."""

    type: Literal["lost"] = "lost"
    step: int
    samples: list[str] = Field(..., description="Sample ids of the batch whose tensor keys are gone; never empty from "
                               "this actor (an empty list, an older actor's, makes the controller look at the keys).")
    reason: str


class RoleFailure(_Msg):
    type: Literal["failure"] = "failure"
    role: str
    worker: str
    reason: str
