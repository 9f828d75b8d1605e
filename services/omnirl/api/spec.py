"""The RLJob spec (`omnirl.dev/v1alpha1`): one source of truth for configuration.

Every component receives only its own sub-model. The CRD's OpenAPI schema is generated from
these classes (`omnirl crd`, see `omnirl.api.crd`), so a field added here is a field users can
write in a manifest. Defaults follow the published recipes (Flow-GRPO arXiv 2505.05470,
DiffusionNFT arXiv 2509.16117; see `references/algorithms.md`).

The `spec.algorithm` models live in `omnirl.api.spec_algorithm` and are re-exported here.
Choices lists are `Literal`s (not `Enum`s): values stay plain strings in Python and in the CRD
(`enum` + `type: string`). Cross-field checks raise `FieldProblem` naming the exact field, so
`omnirl validate` prints e.g. `spec.algorithm.flowGrpo.window.range: [4, 12] is invalid: ...`.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Literal

from pydantic import ConfigDict, Field, PositiveInt, field_validator, model_validator

from omnirl.api._base import CelRule, SpecModel, cel_literal
from omnirl.api.errors import FieldProblem, FieldProblems
from omnirl.api.extensions import FAMILIES, FAMILY_NAMES, REWARD_KIND_NAMES, REWARD_KINDS, families_with, kinds_with
from omnirl.api.paths import path_problem, printable, url_path_problem, utf8_problem
from omnirl.api.podtemplate import check_pod_template
from omnirl.api.roles import MODEL_ROLES, ROLE_NAMES
from omnirl.api.seeds import Seed
from omnirl.api.spec_algorithm import (
    AdvantageSpec,
    AlgorithmSpec,
    AWMSpec,
    DGPOSpec,
    FlowGRPOSpec,
    NFTSpec,
    OldPolicySpec,
    OptimizerSpec,
    RolloutCorrectionSpec,
    RSSpec,
    SamplingSpec,
    WindowSpec,
)
from omnirl.api.spec_parallel import (
    CONTEXT_PARALLEL_FAMILIES,
    GPU_MEMORY_GIB,
    TENSOR_PARALLEL_FAMILIES,
    ActorLayoutSpec,
    RolloutLayoutSpec,
    actor_world,
)
from omnirl.api.spec_queue import check_redis_url
from omnirl.api.spec_reward import check_url, parse_params
from omnirl.api.spec_storage import StorageSpec, check_object_name, check_storage

API_GROUP = "omnirl.dev"
API_VERSION = "v1alpha1"
KIND = "RLJob"

AcceleratorType = Literal["nvidia", "ascend", "cpu"]
FailureAction = Literal["restart-role", "restart-job", "fail-job"]
NormalizeMode = Literal["none", "group", "batch", "minmax"]
# Reward kinds (each registered by its module, `omnirl.api.extensions`) that see a whole group at once (run by the
# controller once a group is complete), and those scored through an endpoint.
GROUP_KINDS: tuple[str, ...] = kinds_with("runs", "group")
REMOTE_KINDS: tuple[str, ...] = kinds_with("runs", "remote")
GRPC_KINDS: tuple[str, ...] = kinds_with("endpoint", "grpc")
MAX_REWARDS = 64
"""Rewards of one job: a bound the CRD's rules over `spec.reward` need (the API server refuses a CRD whose rules'
estimated cost, which grows with the list's largest size, is over its budget); no job comes near it."""
GROUP_ATTEMPTS = 3
"""Attempts of a prompt group in one step: a failed (or too stale) group is generated again up to
twice, then dropped (the controller); every attempt's scores stay in their stream until the step is
collected, which `transferQueue.maxStreamLength` must hold."""
JUDGE_STARTUP_S = 900
"""`reward[].server.startupSeconds` by default: 15 minutes, for a judge that loads a large model (a VLM's weights
from a network volume); the operator's judge startup probe allowed this long before the field existed."""
# Families (each registered by its adapter module, `omnirl.api.extensions`) whose adapter has `velocity_packed`
# (mixed shapes in one forward), and those checked with cuDNN attention (their registration says why).
PACKED_FAMILIES: tuple[str, ...] = families_with("packed")
CUDNN_FAMILIES: tuple[str, ...] = families_with("attention", "cudnn")
UNSIZED_FAMILIES: tuple[str, ...] = families_with("sized", False)
UNGUIDED_FAMILIES: tuple[str, ...] = families_with("guidance", False)
BUILTIN_FAMILIES: tuple[str, ...] = families_with("builtin")

__all__ = [  # the algorithm sub-models live in omnirl.api.spec_algorithm and are re-exported here
    "AdvantageSpec",
    "AlgorithmSpec",
    "AWMSpec",
    "DGPOSpec",
    "FlowGRPOSpec",
    "NFTSpec",
    "OldPolicySpec",
    "OptimizerSpec",
    "RolloutCorrectionSpec",
    "RSSpec",
    "SamplingSpec",
    "WindowSpec",
    "API_GROUP",
    "API_VERSION",
    "KIND",
    "ROLE_NAMES",
    "MODEL_ROLES",
    "PACKED_FAMILIES",
    "CUDNN_FAMILIES",
    "AcceleratorType",
    "FailureAction",
    "SpecModel",
    "LoRASpec",
    "VideoSpec",
    "AudioSpec",
    "ModalitySpec",
    "ModalitiesSpec",
    "ModelSpec",
    "DataSpec",
    "RewardSpec",
    "RewardServerSpec",
    "RewardAutoscaleSpec",
    "NormalizeMode",
    "PipelineSpec",
    "ValidationSpec",
    "AcceleratorSpec",
    "RoleSpec",
    "RolloutRoleSpec",
    "ActorRoleSpec",
    "RolloutLayoutSpec",
    "ActorLayoutSpec",
    "RewardRoleSpec",
    "RolesSpec",
    "TransferQueueSpec",
    "CheckpointSpec",
    "FailurePolicySpec",
    "StorageSpec",
    "TelemetrySpec",
    "RLJobSpec",
    "ObjectMeta",
    "RLJob",
]

# ---------------------------------------------------------------- model


class LoRASpec(SpecModel):
    """LoRA adapters (peft) trained instead of the full weights. `rank`, `alpha` and `targetModules` take
    effect only with `enabled: true`; written without it they are refused (`ignored`)."""

    enabled: bool = Field(False, description="Train LoRA adapters (peft) instead of all weights. rank, alpha and "
                          "targetModules need it: written while it is not true they are refused, not ignored.")
    rank: int = Field(32, ge=1, le=1024, description="LoRA rank r.")
    alpha: float = Field(64.0, gt=0, description="LoRA alpha; the adapter update is scaled by alpha/rank.")
    targetModules: list[str] = Field(
        default_factory=list,
        description="Linear-layer name suffixes LoRA attaches to; empty means the model adapter's defaults.",
    )
    # `ignored()` in CEL: written while enabled is not true, unless equal to the default beside `enabled: false`
    cel_rules = tuple(
        CelRule(f"(has(self.enabled) && self.enabled) || !has(self.{f}) || (has(self.enabled) && {same})",
                f"spec.model.lora.{f}: LoRA is off (lora.enabled is not true), so {f} would be ignored and all "
                f"weights trained; set lora.enabled: true to train LoRA adapters, or remove {f}", f".{f}")
        for f, same in (("rank", "self.rank == {default.rank}"), ("alpha", "self.alpha == {default.alpha}"),
                        ("targetModules", "size(self.targetModules) == 0")))

    def ignored(self) -> dict[str, Any]:
        """The settings written beside LoRA off that would be ignored, as written (camelCase → value); empty
        with `enabled: true`. A written `rank`/`alpha`/`targetModules` counts (a user who wrote `lora: {rank: 8}`
        believes rank-8 adapters are trained, while all weights are), except one equal to its default beside
        an explicit `enabled: false`: it sets nothing, and `loader.dump_rljob` writes such blocks (run
        directories' `job.yaml`, which `omnirl export` and `omnirl eval` read back)."""
        if self.enabled:
            return {}
        out = {}
        for name in sorted(self.model_fields_set - {"enabled"}, key=list(LoRASpec.model_fields).index):
            value = getattr(self, name)
            default = LoRASpec.model_fields[name].get_default(call_default_factory=True)
            if "enabled" not in self.model_fields_set or value != default:
                out[name] = value
        return out


def is_lora_tensor(name: str) -> bool:
    """True when a module tensor name is a LoRA adapter tensor (peft names them
    `…qkv.lora_A.<adapter>.weight`): the one test of "adapters only" for training, checkpoints
    and weight sync."""
    return "lora_" in name


AttentionBackend = Literal["auto", "torch", "cudnn", "math"]
"""`spec.model.attention`: what each value means is owned by `omnirl.models.attention`."""


def check_paths(*fields: tuple[str, str | None]) -> None:
    """Each (field, value) of a model's path-like fields names a possible file (`api/paths.py::path_problem`);
    None values are skipped. Raises FieldProblem naming the first field that does not (its value printable)."""
    for field, value in fields:
        problem = None if value is None else path_problem(value)
        if problem:
            raise FieldProblem(field, printable(value), problem)


def _sizes(fixed: dict[str, float]) -> str:
    """`{"frames": 8, "fps": 8.0}` → `frames 8, fps 8` (a fixed-size family's refusal)."""
    return ", ".join(f"{name} {value:g}" for name, value in fixed.items())


class VideoSpec(SpecModel):
    """The video a multi-modal family generates (docs/omni.md, "Manifest fields")."""

    frames: PositiveInt = Field(..., description="Frames per video.")
    height: PositiveInt = Field(..., description="Frame height in pixels.")
    width: PositiveInt = Field(..., description="Frame width in pixels.")
    fps: float = Field(..., gt=0, le=240, description="Frames per second (the MP4s' rate and the audio's clock).")


class AudioSpec(SpecModel):
    """The audio a multi-modal family generates beside its video."""

    seconds: float = Field(..., gt=0, le=600, description="Length of the audio in seconds.")
    sampleRate: int = Field(..., ge=1000, le=192000, description="Sample rate in Hz.")


class ModalitySpec(SpecModel):
    """How the policy treats one modality of a multi-modal sample (docs/omni.md, "Joint training")."""

    train: bool = Field(True, description="Part of the policy. false: the modality is still generated (the ODE "
                        "update inside FlowGRPO's SDE window) but left out of the log-probability and every loss, as "
                        "two anchors leave the audio out.")
    weight: float = Field(1.0, ge=0, le=1000, description="Loss weight of this modality in DiffusionNFT, AWM and "
                          "DGPO: loss = Σ_m w_m · (the per-element term averaged over modality m), the weights "
                          "normalised to sum 1 over the trained modalities. FlowGRPO's log-probability is one "
                          "Gaussian over every trained element and takes no weight.")
    guidanceScale: float | None = Field(None, ge=1, le=100, description="Classifier-free guidance of this "
                                        "modality's velocity (1 = off); null = algorithm.sampling.guidanceScale.")


class ModalitiesSpec(SpecModel):
    """`spec.model.modalities`: per modality of a multi-modal family; an unlisted one is trained with weight 1."""

    video: ModalitySpec | None = Field(None, description="The video's train, weight and guidanceScale.")
    audio: ModalitySpec | None = Field(None, description="The audio's train, weight and guidanceScale.")

    def written(self) -> dict[str, ModalitySpec]:
        """The modalities set, by name."""
        return {name: getattr(self, name) for name in ("video", "audio") if getattr(self, name) is not None}


class ModelSpec(SpecModel):
    """The model to post-train."""

    family: Literal[FAMILY_NAMES] = Field(  # type: ignore[valid-type]  # the registered families
        "ocr-digits", description="Model adapter family. `ocr-digits` is the built-in CPU demo model; `av-digits` "
        "the built-in audio+video one (docs/omni.md)."
    )
    path: str = Field(
        "builtin",
        min_length=1,
        description="Local directory (or mounted volume) holding the model; `builtin` means the weights "
        "shipped with omnirl (ocr-digits and av-digits only). Relative paths resolve against the manifest's "
        "directory.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Weight dtype. Latents, SDE math and log-probs always stay float32. float16 is "
        "refused: the actor trains the weights (or LoRA adapters) in this dtype with AdamW, whose eps and small "
        "second moments underflow to 0 in float16, so the first step makes them inf or NaN; use bfloat16."
    )
    lora: LoRASpec = Field(default_factory=LoRASpec, description="LoRA settings.")
    resolution: tuple[PositiveInt, PositiveInt] | None = Field(
        None,
        description="Image (height, width) in pixels for the diffusers families (a multiple of 16); null = the "
        "adapter's default, 512x512. Not for ocr-digits, whose image width follows the text.",
    )
    resolutions: list[tuple[PositiveInt, PositiveInt]] | None = Field(
        None,
        min_length=1,
        description="Several image sizes (height, width) in pixels, multiples of 16, for the diffusers families "
        "(multi-aspect training); instead of `resolution`. Each prompt group is sampled at one of them, in turn: "
        "the i-th group of training step s at resolutions[(s + i) mod len] (every size in every step once "
        "promptsPerStep >= len, and the sizes rotate from step to step), held-out prompt i "
        "(validation, omnirl eval) at resolutions[i mod len]. Pair it with roles.rollout.batching: packed, which "
        "runs samples of different sizes in one forward.",
    )
    compile: bool = Field(
        False, description="Compile each transformer block with torch.compile (dynamic shapes; GPU recommended).")
    attention: AttentionBackend = Field(
        "auto", description="The attention kernel of the transformer blocks in rollout and actor. auto: cuDNN for "
        f"families {' and '.join(CUDNN_FAMILIES)} on an NVIDIA Hopper GPU (compute capability 9.x: H100, H200) with "
        "bf16 weights and a head dimension that is a multiple of 8 up to 128 (1.45-1.55x FlashAttention-2 at SD3.5's "
        f"head dim 64), else torch's choice. torch: torch chooses per call. cudnn: cuDNN only ({' or '.join(CUDNN_FAMILIES)}, "
        "rollout and actor on nvidia, bf16 weights). math: the reference kernel (slow; for debugging).")
    gradientCheckpointing: bool = Field(
        False, description="Actor: recompute each transformer block's activations in the backward pass "
        "(less activation memory for about one extra forward).")
    video: VideoSpec | None = Field(None, description="A video family's frames, size and fps; null = the family's "
                                    "default (av-digits: 8 frames of 32x64 at 8 fps, its only size).")
    audio: AudioSpec | None = Field(None, description="An audio family's length and sample rate; null = the family's "
                                    "default (av-digits: 1 s at 8000 Hz, its only one).")
    modalities: ModalitiesSpec | None = Field(
        None, description="Per modality of a multi-modal family (video, audio): train (in the policy or not), "
        "weight (its loss weight) and guidanceScale. Unlisted modalities are trained with weight 1; null = all.")
    cel_rules = (CelRule("{dtype} != 'float16'", "spec.model.dtype: float16 cannot be trained: the actor runs AdamW "
                         "on the float16 weights, whose eps and small second moments underflow to 0, so its first "
                         "step makes the weights inf or NaN; use bfloat16", ".dtype"),)

    def resolution_for(self, position: int) -> tuple[int, int] | None:
        """The image size `(height, width)` in pixels of the prompt group at `position` (see
        `resolutions`: training groups count across steps, held-out prompts by their index);
        `resolution` when one size is set, None for the adapter's default."""
        if self.resolutions:
            h, w = self.resolutions[position % len(self.resolutions)]
            return int(h), int(w)
        return None if self.resolution is None else (int(self.resolution[0]), int(self.resolution[1]))

    @field_validator("resolutions", mode="before")
    @classmethod
    def _pairs(cls, value: Any) -> Any:
        # `resolutions: [512, 512]` (one size, not nested) is the likely slip: say so, not "must be a list" twice
        if isinstance(value, list) and any(not isinstance(v, (list, tuple)) for v in value):
            raise ValueError("must be a list of [height, width] pairs, e.g. [[512, 512], [384, 640]] (one size: "
                             "model.resolution: [512, 512])")
        # tuples: after a before-validator pydantic checks the value as Python, where strict mode (the loader's)
        # refuses a list for a tuple
        return [tuple(v) for v in value] if isinstance(value, list) else value

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        check_paths(("path", self.path))
        if self.dtype == "float16":  # no float32 master copy: AdamW's update is computed in float16
            raise FieldProblem("dtype", "float16", "cannot be trained: the actor runs AdamW on the float16 weights "
                               "(LoRA adapters too), whose eps (1e-8) and small second moments underflow to 0, so "
                               "its first step makes the weights inf or NaN; use bfloat16 (float32's exponent range)")
        ignored = self.lora.ignored()
        if ignored:
            names = " and ".join(", ".join(ignored).rsplit(", ", 1))
            raise FieldProblem("lora", ignored, f"LoRA is off (lora.enabled is not true), so {names} would be ignored "
                               "and all weights trained; set lora.enabled: true to train LoRA adapters, or remove "
                               f"{names}")
        seen: dict[tuple[int, int], int] = {}
        for i, size in enumerate(self.resolutions or ()):
            if size in seen:  # dealt in turn: a repeat is another slot of the same size, not another size
                raise FieldProblem(f"resolutions[{i}]", list(size), f"repeats resolutions[{seen[size]}]: each size "
                                   "is listed once (groups take the sizes in turn); remove it or list another size")
            seen[size] = i
        self.check_media()
        return self

    def modality_settings(self, guidance: float) -> dict[str, dict]:
        """Each modality of the family with its `train`, `weight` and `guidance_scale` (null `guidanceScale`:
        `guidance`, the job's `algorithm.sampling.guidanceScale`): the multi-modal adapters' `modalities` option."""
        written = self.modalities.written() if self.modalities else {}
        out = {}
        for name in FAMILIES[self.family].modalities:
            m = written.get(name, ModalitySpec())
            out[name] = {"train": m.train, "weight": m.weight,
                         "guidance_scale": guidance if m.guidanceScale is None else m.guidanceScale}
        return out

    def check_media(self) -> None:
        """`video`, `audio` and `modalities` against the family's modalities, and `video` / `audio` against the sizes
        of a family whose model makes only one (`api.extensions.FamilyInfo.media`, declared by its
        `register_family`: av-digits' base model was built for 8 frames of 32x64 at 8 fps and 1 s of 8 kHz audio).

        Raises:
            FieldProblem: a modality the family does not make; a size field other than the family's fixed value
                (each wrong field named, `video.frames`, with the value to write); no trained modality, or a
                trained one of weight 0.
        """
        info = FAMILIES[self.family]
        mods = info.modalities
        for key in ("video", "audio"):
            if getattr(self, key) is not None and key not in mods:
                raise FieldProblem(key, getattr(self, key).model_dump(), f"family {self.family} makes no {key} "
                                   f"(its samples: {', '.join(mods)}); remove {key}")
        wrong = []
        for key, fixed in (info.media or {}).items():
            written = getattr(self, key)
            for name, value in fixed.items() if written is not None else ():
                got = getattr(written, name)
                if abs(float(got) - float(value)) > 1e-9:  # fps / seconds are floats: 8 and 8.0 are the same size
                    wrong.append(FieldProblem(
                        f"{key}.{name}", got, f"model.family {self.family} makes only {value:g} (its base model "
                        f"was built for {key} {_sizes(fixed)}); write {name}: {value:g}, or remove {key} (that "
                        "size is its default)"))
        FieldProblems.raise_any(wrong)
        if self.modalities is None:
            return
        written = self.modalities.written()
        for name, m in written.items():
            if name not in mods:
                raise FieldProblem(f"modalities.{name}", m.model_dump(), f"family {self.family} makes "
                                   f"{', '.join(mods)}; remove {name}")
            if m.train and m.weight == 0:
                raise FieldProblem(f"modalities.{name}.weight", 0.0, "a trained modality needs a weight > 0; set "
                                   "a weight, or train: false to leave it out of the policy")
        if not any(written.get(name, ModalitySpec()).train for name in mods):
            raise FieldProblem("modalities", {k: v.model_dump() for k, v in written.items()},
                               "no modality is trained: keep train: true on at least one")


# ---------------------------------------------------------------- data


class DataSpec(SpecModel):
    """Prompt files (UTF-8 text, one prompt per line)."""

    trainPrompts: str = Field(
        ...,
        min_length=1,
        description="Text file with one training prompt per line; relative paths resolve against the "
        "manifest's directory.",
    )
    validationPrompts: str | None = Field(
        None,
        min_length=1,
        description="Text file with held-out prompts used by validation (relative to the manifest); "
        "null disables validation.",
    )
    shuffle: bool = Field(True, description="Shuffle training prompts each epoch (seeded by spec.seed).")

    @model_validator(mode="after")
    def _check(self) -> DataSpec:
        check_paths(("trainPrompts", self.trainPrompts), ("validationPrompts", self.validationPrompts))
        return self


# ---------------------------------------------------------------- reward


RESERVED_REWARD_NAMES: tuple[str, ...] = ("mean", "std", "seconds", "latency_seconds", "total")
"""Reward names whose `reward_<name>` metric is a step statistic of the whole reward (controller/loop.py), and
`total`, the `reward` label of the weighted sum's Prometheus series (telemetry/meters.py)."""


class RewardSpec(SpecModel):
    """One weighted reward function; the sample's reward is Σ weight · normalize(score)."""

    name: str = Field(
        ..., pattern=r"^[a-z0-9][a-z0-9_-]*$", max_length=63, description="Unique reward name (metric label)."
    )
    kind: Literal[REWARD_KIND_NAMES] = Field(  # type: ignore[valid-type]  # the registered reward kinds
        ..., description="Scorer implementation. `pairwise-contrast` is a group-level scorer (it sees a whole "
        "group at once; a toy for testing and demonstration). `avdigits-*`: the four terms of the built-in "
        "audio+video task (model.family av-digits; docs/omni.md).")
    weight: float = Field(1.0, description="Weight in the summed reward.")
    required: bool = Field(
        True, description="A failure of a required scorer fails the sample (its group is refilled or dropped)."
    )
    url: str | None = Field(
        None, min_length=1,
        description="Endpoint: `http` an http(s) score URL, `vlm` the OpenAI API base URL (http://judge:8000/v1), "
        "`grpc` host:port; not set for in-process kinds.",
    )
    params: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="Scorer-specific parameters, checked per kind: " + ", ".join(
            f"{name} {{{', '.join(info.params_keys)}}}" for name, info in REWARD_KINDS.items() if info.params_keys)
        + ".",
    )
    timeoutSeconds: float = Field(
        30.0, gt=0, le=86400, description="Per-request scorer timeout, seconds (at most a day: from about 1e10 s "
        "the HTTP and gRPC clients overflow). A remote scorer whose requests time out but "
        "that answers a cheap one (a judge's GET /models, an empty ScoreRequest) is slower than this: its samples "
        "fail at once, naming this field and one request's measured time (not held for scorerOutageSeconds).")
    normalize: NormalizeMode = Field(
        "none", description="Per-reward normalisation before weighting, over each training step's batch: `none`, "
        "`group` (z-score within each prompt's group), `batch` (z-score over the step) or `minmax` (to [0, 1] over "
        "the step). Applied by the controller; validation reports raw rewards.")
    server: RewardServerSpec | None = Field(
        None, description="A judge server the job runs itself (a Deployment and Service on Kubernetes, a local "
        "process under `omnirl run`); its URL is wired into this reward, so leave `url` unset.")
    cel_rules = (
        CelRule(f"!(self.name in {cel_literal(RESERVED_REWARD_NAMES)})", "spec.reward[].name: "
                f"{', '.join(RESERVED_REWARD_NAMES)} are reserved (metrics name each reward reward_<name>, and these "
                "are the whole reward's); rename it, e.g. <name>-score", ".name"),
        CelRule(f"!has(self.server) || self.kind in {cel_literal(REMOTE_KINDS)}", "spec.reward[].server: only for "
                f"kinds {', '.join(REMOTE_KINDS)} (the other kinds score in the reward workers); remove server or "
                "change kind", ".server"),
        CelRule("!has(self.server) || !has(self.url)", "spec.reward[].url: must be unset when server is given (the "
                "URL of the server the job runs is wired in); remove url or server", ".url"),
        CelRule(f"!has(self.server) || !(self.kind in {cel_literal(GRPC_KINDS)}) || !has(self.server.healthPath)", "spec.reward[].server."
                "healthPath: must be unset for kind grpc (a gRPC server does not answer an HTTP GET: the judge would "
                "never be ready); remove it", ".server.healthPath"),
        CelRule(f"!has(self.server) || !(self.kind in {cel_literal(GRPC_KINDS)}) || {{server.urlPath}} == '/'", "spec.reward[].server.urlPath: "
                "must be unset for kind grpc (the reward workers reach a gRPC server at host:port); remove it, or use "
                "kind http", ".server.urlPath"),
        CelRule(f"self.kind in {cel_literal(REMOTE_KINDS)} || !has(self.url)", "spec.reward[].url: must not be set "
                f"for an in-process kind ({', '.join(k for k in REWARD_KINDS if k not in REMOTE_KINDS)} score in the "
                "reward workers); remove url", ".url"),
        CelRule(f"!(self.kind in {cel_literal(REMOTE_KINDS)}) || has(self.url) || has(self.server)",
                f"spec.reward[].url: required for kinds {', '.join(REMOTE_KINDS[:-1])} and {REMOTE_KINDS[-1]} (the "
                "scorer's endpoint), or give server for a judge the job runs", ".url"),
    )

    @model_validator(mode="after")
    def _check(self) -> RewardSpec:
        if self.name in RESERVED_REWARD_NAMES:  # `reward_<name>` would overwrite the step's own metric
            raise FieldProblem("name", self.name, "is reserved: metrics name each reward reward_<name>, "
                               "val_reward_<name> and omnirl_reward_mean{reward=<name>}, and this one is the whole "
                               f"reward's ({', '.join(RESERVED_REWARD_NAMES)} are taken); rename it, e.g. "
                               f"{self.name}-score")
        if self.server is not None:
            if self.kind not in REMOTE_KINDS:
                raise FieldProblem("server", {"command": self.server.command}, f"only for kinds {', '.join(REMOTE_KINDS)} (kind {self.kind} "
                                   "scores in the reward workers); remove server or change kind")
            if self.url:
                raise FieldProblem("url", self.url, "must be unset when server is given (the URL of the server "
                                   "the job runs is wired in); remove url or server")
            if self.kind in GRPC_KINDS and self.server.healthPath is not None:  # an HTTP GET a gRPC server never passes
                raise FieldProblem("server.healthPath", self.server.healthPath, "must be unset for kind grpc (a gRPC "
                                   "server does not answer an HTTP GET: the judge would never be ready); remove it, "
                                   "the judge is then ready once its port accepts connections")
            if self.kind in GRPC_KINDS and self.server.urlPath != "/":  # a gRPC target is host:port, nothing after it
                raise FieldProblem("server.urlPath", self.server.urlPath, "must be unset for kind grpc (the reward "
                                   "workers reach a gRPC server at host:port, so a path would be ignored); remove "
                                   "it, or use kind http for a server of the HTTP scorer protocol at that path")
        else:
            check_url(self.kind, self.url)
        parse_params(self.kind, self.params)
        return self

    def typed_params(self) -> SpecModel:
        """`params` as the kind's params class (`omnirl.api.extensions.params_model`), defaults filled in."""
        return parse_params(self.kind, self.params)


# ---------------------------------------------------------------- pipeline, roles, infra


class PipelineSpec(SpecModel):
    """How rollout, reward and training overlap (docs/concepts.md, Pipelining)."""

    mode: Literal["sync", "async-reward", "fully-async"] = Field(
        "async-reward",
        description="`sync`: reward after all rollouts; `async-reward`: per-sample reward streaming; "
        "`fully-async`: rollout of step n+1 overlaps training of step n.",
    )
    maxStaleness: int = Field(1, ge=0, description="fully-async: max policy versions a sample may lag.")
    staleAction: Literal["drop", "wait"] = Field(
        "drop", description="fully-async: drop samples staler than maxStaleness, or wait for fresh ones."
    )


class ValidationSpec(SpecModel):
    """Held-out validation with the deterministic (ODE) sampler."""

    everySteps: int = Field(5, ge=0, description="Validate every N training steps (0 = only at start and end).")
    numSteps: int = Field(20, ge=2, le=1000, description="ODE sampler denoising steps for validation.")
    maxPrompts: int = Field(256, ge=1, description="Use at most this many validation prompts.")
    seed: Seed = Field(1234, description="Noise seed; fixed so validations are comparable. A signed 64-bit integer "
                       "(`omnirl.api.seeds.derive` hashes it).")


class AcceleratorSpec(SpecModel):
    """Accelerator sugar, expanded by the operator into resource limits, nodeSelector and tolerations."""

    type: AcceleratorType = Field("cpu", description="nvidia (nvidia.com/gpu), ascend (huawei.com/Ascend910) or cpu.")
    product: Literal[tuple(GPU_MEMORY_GIB)] | None = Field(  # type: ignore[valid-type]
        None, description="The device model, for its memory (`omnirl plan` and `omnirl validate` fit each role's "
        "per-device memory into it): " + ", ".join(f"{k} ({v:g} GiB)" for k, v in GPU_MEMORY_GIB.items()) + ". Null: "
        "the type's common one (nvidia h100-80gb, ascend ascend-910b).")
    count: int = Field(0, ge=0, le=16, description="Accelerators per pod (must be 0 for cpu, >= 1 otherwise): 1 "
                       "for reward and controller pods; for rollout and actor pods what their `parallel` layout "
                       "puts in one pod (a rank per device); a judge server's may use more.")
    cel_rules = (
        CelRule("{type} == 'cpu' || {count} >= 1", "accelerator.count: must be >= 1 for type nvidia or ascend",
                ".count"),
        CelRule("{type} != 'cpu' || {count} == 0", "accelerator.count: must be 0 for type cpu (set type nvidia or "
                "ascend)", ".count"),
        CelRule("!has(self.product) || (self.product == 'ascend-910b' ? {type} == 'ascend' : {type} == 'nvidia')",
                "accelerator.product: must be a device of accelerator.type (ascend-910b for ascend, the others for "
                "nvidia, none for cpu)", ".product"),
    )

    @model_validator(mode="after")
    def _check(self) -> AcceleratorSpec:
        if self.product is not None and (self.type == "ascend") != (self.product == "ascend-910b"):
            kind = "ascend" if self.product == "ascend-910b" else "nvidia"
            raise FieldProblem("product", self.product, f"is a {kind} device, and type is {self.type}: set type "
                               f"{kind}, or a product of type {self.type} (ascend-910b for ascend, "
                               f"{', '.join(k for k in GPU_MEMORY_GIB if k != 'ascend-910b')} for nvidia, none for cpu)")
        if self.type != "cpu" and self.count < 1:
            raise FieldProblem("count", self.count, f"must be >= 1 for type {self.type}")
        if self.type == "cpu" and self.count != 0:
            raise FieldProblem("count", self.count, "must be 0 for type cpu (set type nvidia or ascend)")
        return self


SERVER_PLACEHOLDERS = ("port", "modelPath")  # substituted in reward[].server.command/args (scorers/judges.py::argv)


def misspelt_placeholder(arg: str) -> tuple[str, str] | None:
    """`(written, meant)` for a `{name}` in a judge's argument that looks like `{port}` or `{modelPath}` but is
    not one (`{prot}`, `{PORT}`, `{model_path}`, `{model}`), else None. Such a name is passed on as written: a
    `--port {prot}` judge exited 2 at start, and on Kubernetes crash-looped until JudgeFailed, after `omnirl
    validate` said ok. Only near misses are refused: `${HOME}` (a shell's), `{{x}}` and `'{"a": 1}'` stay."""
    for m in re.finditer(r"(?<![${])\{([A-Za-z_][A-Za-z0-9_-]*)\}(?!\})", arg):
        name = m[1]
        if name in SERVER_PLACEHOLDERS:
            continue
        key = name.lower().replace("_", "").replace("-", "")
        for meant in SERVER_PLACEHOLDERS:
            if key == meant.lower() or difflib.SequenceMatcher(None, key, meant.lower()).ratio() >= 0.7:
                return name, meant
    return None


class RewardServerSpec(SpecModel):
    """A judge server run by the job beside its roles (`reward[].server`).

    `{port}` and `{modelPath}` in `command`/`args` are replaced by the port the server must listen
    on and the model directory it sees. On Kubernetes: Deployment and Service `<job>-judge-<name>`,
    the controller starts once a judge pod is Ready; locally: a process on a free port.
    """

    image: str | None = Field(None, min_length=1, description="Container image; null = the omnirl reward image "
                              "(for scorers served from omnirl itself). Ignored by `omnirl run`.")
    command: list[str] = Field(..., min_length=1, description="Command line of the server (e.g. `[vllm, serve, "
                               "{modelPath}, --port, '{port}']`); `{port}` and `{modelPath}` are substituted.")
    args: list[str] = Field(default_factory=list, description="Arguments after command (same substitutions).")
    modelPath: str | None = Field(None, min_length=1, description="Model directory on the node (a read-only "
                                  "hostPath mounted at the same path) or, locally, on this machine.")
    volume: dict[str, Any] | None = Field(
        None, description="A Kubernetes volume source holding the model (e.g. `{persistentVolumeClaim: {claimName: "
        "judge-model}}`), mounted read-only at /models; `{modelPath}` is then /models. Not for `omnirl run`.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    accelerator: AcceleratorSpec = Field(default_factory=AcceleratorSpec, description="Accelerator sugar.")
    replicas: int = Field(1, ge=1, le=64, description="Judge pods behind the Service.")
    port: int = Field(8000, ge=1024, le=65535, description="Port the server listens on in its pod.")
    urlPath: str = Field("/", pattern=r"^/", description="Path appended to the wired URL (`/v1/score` for the HTTP "
                         "scorer protocol, `/v1` for an OpenAI-compatible server); not for kind grpc (host:port).")
    healthPath: str | None = Field(None, pattern=r"^/", description="HTTP path answering 200 when the server is "
                                   "ready (`/health` on vLLM); null = ready once the port accepts connections.")
    startupSeconds: int = Field(
        JUDGE_STARTUP_S, ge=1, le=86400, description="How long the server may take from its start to its first "
        "answer (healthPath, else the port), loading its model. `omnirl run` and `omnirl eval` give up after it "
        "(at once, with its exit code and log, when its process exits); on Kubernetes its container's startup "
        "probe allows as long (10 s periods) before the kubelet restarts it.")
    template: dict[str, Any] | None = Field(
        None, description="Optional PodTemplateSpec merged over the judge's generated one (user fields win; its "
        "container is named `judge`): node pools (nodeSelector, tolerations), imagePullSecrets, env. Ignored by "
        "`omnirl run`.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    cel_rules = (
        CelRule("!has(self.modelPath) || !has(self.volume)", "spec.reward[].server.volume: give modelPath (a "
                "directory on the node) or volume (a volume source mounted at /models), not both", ".volume"),
        CelRule("!has(self.modelPath) || self.modelPath.startsWith('/')", "spec.reward[].server.modelPath: must be "
                "an absolute path (it is mounted at the same path in the pod)", ".modelPath"),
    )

    @model_validator(mode="after")
    def _check(self) -> RewardServerSpec:
        check_paths(("modelPath", self.modelPath), ("command[0]", self.command[0]))
        for field in ("urlPath", "healthPath"):
            value = getattr(self, field)
            problem = None if value is None else url_path_problem(value)
            if problem:
                raise FieldProblem(field, printable(value), problem)
        for field in ("command", "args"):  # each is one argv string of the server's exec: no NUL, UTF-8
            for i, arg in enumerate(getattr(self, field)):
                problem = "must not contain a NUL character (\\x00): no argument holds one" if "\x00" in arg \
                    else utf8_problem(arg)
                if problem:
                    raise FieldProblem(f"{field}[{i}]", printable(arg), problem)
        if self.modelPath is not None and self.volume is not None:
            raise FieldProblem("volume", self.volume, "give modelPath (a directory on the node) or volume (a volume "
                               "source mounted at /models), not both")
        if self.modelPath is not None and not self.modelPath.startswith("/"):
            raise FieldProblem("modelPath", self.modelPath, "must be an absolute path (it is mounted at the "
                               "same path in the pod)")
        if self.volume is not None and len(self.volume) != 1:
            raise FieldProblem("volume", sorted(self.volume), "must hold exactly one volume source, e.g. "
                               "{persistentVolumeClaim: {claimName: NAME}}")
        for field in ("command", "args"):
            for arg in getattr(self, field):
                misspelt = misspelt_placeholder(arg)
                if misspelt is not None:
                    raise FieldProblem(field, arg, f"has the placeholder {{{misspelt[0]}}}, which is not substituted "
                                       f"(the server would get it as written); did you mean {{{misspelt[1]}}}? Only "
                                       "{port} and {modelPath} are")
        for field in ("command", "args"):  # the list that holds it: it said args for a {modelPath} in command
            if any("{modelPath}" in a for a in getattr(self, field)) and self.modelPath is None and self.volume is None:
                raise FieldProblem(field, "{modelPath}", "is used but neither modelPath nor volume is given; set "
                                   "server.modelPath (a model directory on the node, or locally on this machine) or "
                                   "server.volume")
        if self.template is not None:
            check_pod_template(self.template, "judge", "template")
        return self


class RewardAutoscaleSpec(SpecModel):
    """Reward workers follow the samples backlog (`roles.reward.autoscale`, Kubernetes only).

    The operator counts the samples not yet scored (undelivered plus delivered-but-unacknowledged
    entries of the samples stream) and asks for `ceil(backlog / targetBacklogPerReplica)` workers,
    scaling up at most once per `scaleUpCooldownSeconds` and down at most once per
    `scaleDownCooldownSeconds`, and down only while the backlog would fit the smaller count at
    `scaleDownRatio` of its target (hysteresis: no flapping around a boundary).
    """

    minReplicas: int = Field(1, ge=1, le=1024, description="Fewest reward workers.")
    maxReplicas: int = Field(..., ge=1, le=1024, description="Most reward workers.")
    targetBacklogPerReplica: int = Field(64, ge=1, description="Unscored samples one worker should hold.")
    scaleUpCooldownSeconds: float = Field(30.0, ge=0, description="Least time between scale-ups, seconds.")
    scaleDownCooldownSeconds: float = Field(300.0, ge=0, description="Least time after any scaling before a "
                                            "scale-down, seconds.")
    scaleDownRatio: float = Field(0.5, gt=0, le=1, description="Scale down only while the backlog is below this "
                                  "fraction of the smaller count's capacity.")
    cel_rules = (CelRule("self.maxReplicas >= {minReplicas}", "spec.roles.reward.autoscale.maxReplicas: must be >= "
                         "minReplicas", ".maxReplicas"),)

    @model_validator(mode="after")
    def _check(self) -> RewardAutoscaleSpec:
        if self.maxReplicas < self.minReplicas:
            raise FieldProblem("maxReplicas", self.maxReplicas, f"must be >= minReplicas ({self.minReplicas})")
        return self


class RoleSpec(SpecModel):
    """A role: its pods (or local processes) and their resources."""

    replicas: int = Field(1, ge=1, le=1024, description="Pods (or local processes) of this role.")
    accelerator: AcceleratorSpec = Field(default_factory=AcceleratorSpec, description="Accelerator sugar.")
    template: dict[str, Any] | None = Field(
        None,
        description="Optional PodTemplateSpec merged over the generated one (user fields win).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class RolloutRoleSpec(RoleSpec):
    """Rollout workers (the diffusion engine)."""

    batching: Literal["stepwise", "packed", "static"] = Field(
        "stepwise", description="`stepwise`: continuous batching, one denoiser forward per latent-shape bucket; "
        f"`packed` ({', '.join(PACKED_FAMILIES)} only): samples of different shapes share one forward (concatenated image tokens, attention "
        "per sample); it helps when a worker holds many shapes with few samples each (model.resolutions below "
        "512x512 measured 1.4x static batching on an H200; at 512x512 and above about 1.0x), and runs like "
        "`stepwise` when every sample has one shape (model.resolution); `static`: request "
        "batching from first step to last (baseline)."
    )
    maxBatchSize: int = Field(64, ge=1, description="Max samples in one denoiser forward.")
    parallel: RolloutLayoutSpec = Field(default_factory=RolloutLayoutSpec, description="How one replica is laid "
                                        "out over its devices: Ulysses and tensor-parallel degrees of the DiT, "
                                        "the text encoder's tensor-parallel degree, pods per replica "
                                        "(docs/parallel.md). Default: one device per replica.")


class ActorRoleSpec(RoleSpec):
    """The actor's ranks: `replicas` data-parallel ranks, each `parallel.ulysses` devices."""

    parallel: ActorLayoutSpec = Field(default_factory=ActorLayoutSpec, description="How the actor's ranks are laid "
                                      "out: Ulysses degree of each data-parallel rank, HSDP replicate groups, the "
                                      "text encoder's tensor-parallel degree (docs/parallel.md). Default: FSDP2 over "
                                      "replicas ranks of one device each.")


class RewardRoleSpec(RoleSpec):
    """Reward workers (the scorers)."""

    batchSize: int = Field(32, ge=1, description="Max samples per scorer call.")
    autoscale: RewardAutoscaleSpec | None = Field(
        None, description="Scale the reward workers with the samples backlog (Kubernetes); `replicas` is then "
        "the starting count. Null: fixed `replicas`.")
    cel_rules = (CelRule("!has(self.autoscale) || ({replicas} >= {autoscale.minReplicas} && "
                         "{replicas} <= self.autoscale.maxReplicas)", "spec.roles.reward.replicas: must lie in "
                         "autoscale [minReplicas, maxReplicas] (it is the starting count)", ".replicas"),)

    @model_validator(mode="after")
    def _check_autoscale(self) -> RewardRoleSpec:
        a = self.autoscale
        if a is not None and not a.minReplicas <= self.replicas <= a.maxReplicas:
            raise FieldProblem("replicas", self.replicas, f"must lie in autoscale [minReplicas, maxReplicas] = "
                               f"[{a.minReplicas}, {a.maxReplicas}] (it is the starting count)")
        return self


class RolesSpec(SpecModel):
    """The four roles of a job."""

    rollout: RolloutRoleSpec = Field(default_factory=RolloutRoleSpec, description="Rollout workers.")
    reward: RewardRoleSpec = Field(default_factory=RewardRoleSpec, description="Reward workers.")
    actor: ActorRoleSpec = Field(default_factory=ActorRoleSpec, description="Actor ranks: > 1 shards the model "
                                 "with FSDP2 and splits each batch's micro-batches over them (each rank "
                                 "parallel.ulysses devices).")
    controller: RoleSpec = Field(default_factory=RoleSpec, description="The single controller (replicas 1).")
    cel_rules = (
        CelRule("{controller.replicas} == 1", "spec.roles.controller.replicas: must be 1 (one controller per job)",
                ".controller.replicas"),
        *(CelRule(f"{{{role}.accelerator.count}} <= 1", f"spec.roles.{role}.accelerator.count: must be at most 1: "
                  f"each {role} pod runs one process on one device; use replicas: N with count: 1",
                  f".{role}.accelerator.count") for role in ROLE_NAMES if role not in MODEL_ROLES),
        CelRule("{rollout.accelerator.type} == 'cpu' || {rollout.accelerator.count} * {rollout.parallel.podsPerReplica}"
                " == {rollout.parallel.ulysses} * {rollout.parallel.tensor}", "spec.roles.rollout.accelerator.count: "
                "must be the devices of one pod of a replica, parallel.ulysses × parallel.tensor / "
                "parallel.podsPerReplica (a rank per device)", ".rollout.accelerator.count"),
        CelRule("{actor.accelerator.type} == 'cpu' || ({actor.replicas} * {actor.parallel.ulysses}) % "
                "{actor.accelerator.count} == 0", "spec.roles.actor.accelerator.count: must divide the actor's "
                "ranks, replicas × parallel.ulysses (each pod holds as many ranks as devices)",
                ".actor.accelerator.count"),
        CelRule("{actor.replicas} % {actor.parallel.replicate} == 0", "spec.roles.actor.parallel.replicate: must "
                "divide roles.actor.replicas (each HSDP group holds as many data-parallel ranks)",
                ".actor.parallel.replicate"),
    )

    @model_validator(mode="after")
    def _check(self) -> RolesSpec:
        problems: list[FieldProblem] = []  # every role's, reported at once (FieldProblems: one line each)
        if self.controller.replicas != 1:
            problems.append(FieldProblem("controller.replicas", self.controller.replicas,
                                         "must be 1 (one controller per job)"))
        for role in ROLE_NAMES:
            if role in MODEL_ROLES:  # their devices follow their `parallel` layout: _layout_problems
                continue
            # a reward or controller pod (or local process) is one process on one device (`cuda:0`/`npu:0`):
            # more would be allocated to the pod and sit idle
            count = getattr(self, role).accelerator.count
            if count > 1:
                problems.append(FieldProblem(f"{role}.accelerator.count", count, f"must be at most 1: each {role} "
                                             f"pod runs one process on one device, the others would sit idle; use "
                                             "replicas: N with count: 1 (one worker per device)"))
        problems += self._layout_problems()
        for role in ("rollout", "reward", "actor", "controller"):
            template = getattr(self, role).template
            if template is not None:
                try:
                    check_pod_template(template, role, f"{role}.template", role=True)
                except FieldProblem as problem:
                    problems.append(problem)
        FieldProblems.raise_any(problems)
        return self

    def _layout_problems(self) -> list[FieldProblem]:
        """The model roles' device counts against their `parallel` layouts: a rank per device, so a pod's
        `accelerator.count` is the ranks it holds (docs/parallel.md)."""
        problems: list[FieldProblem] = []
        rollout, actor = self.rollout, self.actor
        layout = rollout.parallel
        acc = rollout.accelerator
        if acc.type != "cpu" and acc.count * layout.podsPerReplica != layout.ranks:
            per_pod = layout.ranks_per_pod
            gangs = [f"podsPerReplica: {p} with count: {layout.ranks // p}" for p in range(2, layout.ranks + 1)
                     if layout.ranks % p == 0 and layout.ranks // p <= 16][:3]
            problems.append(FieldProblem("rollout.accelerator.count", acc.count, f"must be {per_pod}: a rollout "
                                         f"replica is parallel.ulysses × parallel.tensor = {layout.ulysses} × "
                                         f"{layout.tensor} = {layout.ranks} device(s) (a rank per device) in "
                                         f"parallel.podsPerReplica = {layout.podsPerReplica} pod(s); set count: "
                                         f"{per_pod}" + (f", or {' or '.join(gangs)}" if gangs and per_pod > 1 else "")
                                         + (", or raise parallel.ulysses/tensor to use more devices per replica"
                                            if acc.count > per_pod else "")))
        world = actor_world(actor.replicas, actor.parallel)
        acc = actor.accelerator
        if acc.type != "cpu" and world % acc.count:
            valid = [d for d in range(1, min(world, 16) + 1) if world % d == 0]
            problems.append(FieldProblem("actor.accelerator.count", acc.count, f"must divide the actor's ranks, "
                                         f"replicas × parallel.ulysses = {actor.replicas} × {actor.parallel.ulysses} "
                                         f"= {world} (each pod holds as many ranks as devices); valid: {valid}"))
        if actor.replicas % actor.parallel.replicate:
            valid = [d for d in range(1, actor.replicas + 1) if actor.replicas % d == 0]
            problems.append(FieldProblem("actor.parallel.replicate", actor.parallel.replicate, f"must divide "
                                         f"roles.actor.replicas ({actor.replicas}): each HSDP group holds as many "
                                         f"data-parallel ranks; valid: {valid}"))
        return problems


# the queue's times go to Redis in ms (a tensor key's PX, XAUTOCLAIM's min-idle-time): from about 9.2e15 s
# (int64 ms) Redis answers "value is not an integer or out of range" at the first publish; a year is no limit
MAX_QUEUE_S = 365 * 86400
# and from below: Redis takes whole ms, so 0.0005 s was 0: PX 0 ("invalid expire time", every publish) and a
# min-idle-time of 0 (every entry in a live consumer's hands reclaimable by the next read). Beyond that, a sample's
# tensors must outlive the longest it waits: the smallest job here, the CPU demo on 2 cores, takes 6-16 s a step
# and 22-27 s a 256-prompt validation round (tensorTtlSeconds 2 failed it with MissingTensors at the first round);
# claimIdleSeconds 1 ran it cleanly (an entry reclaimed while still in progress is done twice, not wrongly)
MIN_TENSOR_TTL_S = 60
MIN_CLAIM_IDLE_S = 1


class TransferQueueSpec(SpecModel):
    """The Redis-Streams TransferQueue."""

    redisUrl: str | None = Field(
        None, description="The Redis of the queue: redis://[[user]:password@]host[:port][/db] (rediss:// for TLS); "
        "null means an embedded redis-server (local) or the chart's Redis."
    )
    passwordSecret: str | None = Field(None, description="Kubernetes Secret (key `password`) for Redis.")
    maxStreamLength: int = Field(10_000, ge=1, description="Back-pressure bound on each stream (entries).")
    tensorTtlSeconds: float = Field(
        3600.0, le=MAX_QUEUE_S, json_schema_extra={"minimum": MIN_TENSOR_TTL_S}, description="TTL of trajectory "
        "tensors in Redis, seconds: at least 60 (a sample's tensors must outlive its rollout, scoring, training step "
        "and validation round; the consumers delete them when done) and at most 365 days (Redis refuses an expiry "
        "from about 9.2e15 s).")
    claimIdleSeconds: float = Field(
        60.0, le=MAX_QUEUE_S, json_schema_extra={"minimum": MIN_CLAIM_IDLE_S}, description="Reclaim a dead "
        "consumer's entries after, seconds: at least 1 (Redis takes whole ms; an entry still in progress is "
        "reclaimed and done twice) and at most 365 days (Redis refuses XAUTOCLAIM's min-idle-time from about "
        "9.2e15 s).")
    cel_rules = (CelRule("{tensorTtlSeconds} > {claimIdleSeconds}", "spec.transferQueue.tensorTtlSeconds: must be > "
                         "claimIdleSeconds (a sample reclaimed from a dead consumer must still have its tensors)",
                         ".tensorTtlSeconds"),)

    @model_validator(mode="after")
    def _check(self) -> TransferQueueSpec:
        if self.passwordSecret:  # "" is no Secret, as unset; the pods' secretKeyRef: the API server refuses another name
            check_object_name("passwordSecret", self.passwordSecret, "Secret")
        if self.redisUrl:  # "" is no URL, as unset (the launcher and the operator read it so)
            check_redis_url(self.redisUrl)
        for field, floor, why in (
                ("tensorTtlSeconds", MIN_TENSOR_TTL_S, "a sample's tensors must outlive its rollout, scoring, training "
                 "step and validation round (the CPU demo's round takes ~25 s; used tensors are deleted, a long TTL only "
                 "keeps a crash's leftovers longer); the default is 3600"),
                ("claimIdleSeconds", MIN_CLAIM_IDLE_S, "Redis takes it in whole ms (0.0005 was 0), and an entry a live "
                 "consumer holds longer without renewing its claim (an engine step) is taken by another consumer's next "
                 "read and done twice; the default is 60")):
            value = getattr(self, field)
            if value < floor:
                raise FieldProblem(field, value, f"must be >= {floor:g} seconds: {why}")
        if self.tensorTtlSeconds <= self.claimIdleSeconds:
            raise FieldProblem("tensorTtlSeconds", self.tensorTtlSeconds, f"must be > claimIdleSeconds "
                               f"({self.claimIdleSeconds:g}): a sample reclaimed from a dead consumer after "
                               "claimIdleSeconds must still have its tensors, and a sample's image and trajectory must "
                               "outlive its rollout, scoring and training step (default 3600)")
        return self


RUN_DIR_ENTRIES: tuple[str, ...] = ("exports", "samples", "logs", "ledger", "redis")
"""The run directory's own folders (exports, validation grids, role logs, sample ledgers, the embedded
Redis): `checkpoint.dir` may not be one of them."""


class CheckpointSpec(SpecModel):
    """Checkpointing of the actor's weights and optimiser state."""

    everySteps: int = Field(10, ge=0, description="Save every N training steps (0 = only at the end).")
    dir: str = Field("checkpoints", min_length=1, description="Checkpoint directory, relative to the run output "
                     "(inside it: on Kubernetes only the run directory is on the job's volume).")
    keep: int = Field(2, ge=1, description="Checkpoints kept besides `latest`.")

    @model_validator(mode="after")
    def _check(self) -> CheckpointSpec:
        check_paths(("dir", self.dir))
        # the actor writes OUT/dir, the controller and `omnirl export` read it there: outside OUT a pod's
        # checkpoints would miss the volume (lost on restart, not seen by the controller's pod)
        if self.dir.startswith("/") or ".." in self.dir.split("/"):
            raise FieldProblem("dir", self.dir, "must be a path inside the run directory (relative, no '..'): on "
                               "Kubernetes only the run directory is on the job's volume; e.g. checkpoints")
        top = next((part for part in self.dir.split("/") if part not in ("", ".")), "")
        if top in RUN_DIR_ENTRIES or not top:
            raise FieldProblem("dir", self.dir, f"must not be the run directory itself nor in its {', '.join(RUN_DIR_ENTRIES)} "
                               "(the export of a checkpoint replaced it under exports/: the job restarted and failed); "
                               "e.g. checkpoints")
        return self


# failurePolicy's deadlines: 30 days is no deadline in practice; their sum becomes the startup probe's
# failureThreshold (an int32 in Kubernetes, in 10 s periods: 1e12 s rendered 100000000060) and the rollout
# worker's TCPStore connect timeout (int64 ns: 5e13 s turned negative and failed at once)
MAX_DEADLINE_S = 30 * 86400


class FailurePolicySpec(SpecModel):
    """What to do when pods fail, and deadlines."""

    maxRestarts: int = Field(
        3, ge=0, description="Restarts allowed before the job fails: each restart of the whole job (from the latest "
        "checkpoint), and each role replica's or judge server pod's own restarts, count against it separately."
    )
    rollout: FailureAction = Field("restart-role", description="Action when a rollout pod fails.")
    reward: FailureAction = Field("restart-role", description="Action when a reward pod fails.")
    actor: FailureAction = Field("restart-job", description="Action when an actor pod fails.")
    controller: FailureAction = Field("restart-job", description="Action when the controller fails.")
    activeDeadlineSeconds: int | None = Field(
        None, ge=1, description="Kubernetes: fail the job (not restarted) once it has been active this many seconds: "
        "counted from its creation or its last resume from suspend, Pending time (pods waiting for nodes, images, "
        "judges) included; restarts and spec edits do not reset the clock. Not used by `omnirl run`.")
    progressDeadlineSeconds: float = Field(
        600.0, gt=0, le=MAX_DEADLINE_S, description="A role whose main loop has not beaten (heartbeat in Redis, gRPC health) for this "
        "many seconds is stuck and handled like a failed one (its action above); make it longer than the slowest "
        "single unit of work (one in-process scorer call, one training step, one checkpoint write). A reward worker "
        "waiting on a remote scorer beats meanwhile, up to that scorer's timeouts; a role loading its model, and "
        "torch.compile compiling (model.compile's warm-up, a recompile), beat meanwhile up to "
        "startupDeadlineSeconds. At most 30 days (2592000), like startupDeadlineSeconds."
    )
    startupDeadlineSeconds: float = Field(
        1200.0, gt=0, le=MAX_DEADLINE_S, description="How long a role's start-up (importing torch, loading the model, its checkpoint "
        "and scorers, joining the actor's ranks) and each torch.compile compilation (model.compile's first step, a recompile for a "
        "new shape) may take: they count as progress for this many seconds, so a load longer than "
        "progressDeadlineSeconds is not taken for a hang. One that is still running after it is stuck once "
        "progressDeadlineSeconds more have passed: the sum is the longest a start-up may take (on Kubernetes the pods' "
        "startup probe allows it; the actor waits as long for the rollout workers to register, the controller twice "
        "as long for the actor). At most 30 days (2592000): from about 1e10 s the startup probe's failureThreshold "
        "(a 32-bit count of 10 s periods) and torch's store timeout overflow."
    )
    scorerOutageSeconds: float = Field(
        600.0, ge=0, description="How long a reward worker holds the samples of a scorer that does not answer "
        "(unreachable, timing out and not answering a cheap request either, 408/409/429/5xx after its maxRetries: a "
        "judge restarting), scoring them again "
        "every 1..30 s, before they fail with the reason (their groups then refilled or dropped); 0: fail at once."
    )
    terminationGracePeriodSeconds: int = Field(
        60, ge=1, description="SIGTERM to SIGKILL: the time a role gets to finish or hand back its work and the actor "
        "to write a checkpoint (the pods' terminationGracePeriodSeconds)."
    )
    ttlSecondsAfterFinished: int | None = Field(
        None, ge=0, description="Delete the job this many seconds after it finishes."
    )

    @property
    def startup_limit_s(self) -> float:
        """Seconds a role's start-up may take before it is found stale: its load beats for
        `startupDeadlineSeconds`, then `progressDeadlineSeconds` pass without a beat."""
        return self.startupDeadlineSeconds + self.progressDeadlineSeconds


class TelemetrySpec(SpecModel):
    """Where a run's numbers go besides `metrics.jsonl` and the Prometheus meters (always on)."""

    tensorboard: bool = Field(
        False, description="Write TensorBoard event files of every metrics.jsonl step and validation line to "
        "OUT/tensorboard/ (the run directory: spec.storage's claim on Kubernetes); needs the tensorboard package "
        "(pip install 'omnirl[tensorboard]') where the controller runs. View with tensorboard --logdir OUT/tensorboard.")


class RLJobSpec(SpecModel):
    """`spec` of an RLJob."""

    model: ModelSpec = Field(default_factory=ModelSpec, description="The model to post-train.")
    data: DataSpec = Field(..., description="Prompt files.")
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec, description="RL algorithm and its settings.")
    reward: list[RewardSpec] = Field(..., min_length=1, max_length=MAX_REWARDS, description="Weighted reward "
                                     f"functions (at most {MAX_REWARDS}).")
    pipeline: PipelineSpec = Field(default_factory=PipelineSpec, description="Pipelining mode.")
    validation: ValidationSpec = Field(default_factory=ValidationSpec, description="Held-out validation.")
    roles: RolesSpec = Field(default_factory=RolesSpec, description="Role replicas and resources.")
    transferQueue: TransferQueueSpec = Field(default_factory=TransferQueueSpec, description="Redis queue.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing.")
    failurePolicy: FailurePolicySpec = Field(default_factory=FailurePolicySpec, description="Failure handling.")
    storage: StorageSpec | None = Field(
        None, description="Kubernetes: the PersistentVolumeClaim holding the run directory (checkpoints, metrics, "
        "samples, the exported model); unset = an emptyDir, lost with the pods. Locally: `omnirl run --out`.")
    seed: Seed = Field(0, description="Global seed (data order, SDE windows, sampling noise). A signed 64-bit "
                       "integer (`omnirl.api.seeds.derive` hashes it).")
    suspend: bool = Field(False, description="Suspended jobs have no running pods (Kueue admission).")
    telemetry: TelemetrySpec = Field(default_factory=TelemetrySpec, description="Extra metrics outputs (TensorBoard).")
    cel_rules = (
        CelRule("self.reward.all(r, self.reward.exists_one(s, s.name == r.name))", "spec.reward[].name: must be "
                "unique; rename one of the rewards that share a name", ".reward"),
        CelRule("self.reward.exists(r, !has(r.weight) || r.weight != 0.0)", "spec.reward: every weight is 0, so every "
                "sample's reward is 0 and nothing is learnt; give at least one reward a non-zero weight", ".reward"),
        CelRule(f"!has(self.data.validationPrompts) || self.reward.exists(r, !(r.kind in {cel_literal(GROUP_KINDS)}))",
                "spec.data.validationPrompts: needs a per-sample reward (validation scores single samples and every "
                "reward is group-level); add one (e.g. kind ocr) or remove validationPrompts", ".data.validationPrompts"),
        CelRule("!has(self.storage) || {roles.actor.replicas} * {roles.actor.parallel.ulysses} <= "
                "({roles.actor.accelerator.count} > 1 ? {roles.actor.accelerator.count} : 1) || "
                "'ReadWriteMany' in {storage.accessModes} || {storage.singleNode}", "spec.storage.accessModes: must "
                "hold ReadWriteMany when the actor has more than one pod (roles.actor.replicas × parallel.ulysses "
                "ranks over accelerator.count per pod): every pod mounts the run volume, and a ReadWriteOnce volume "
                "attaches to one node; or set storage.singleNode: true if all pods fit one node", ".storage.accessModes"),
        *(CelRule(f"{{roles.{role}.parallel.ulysses}} == 1 || {{model.family}} in "
                  f"{cel_literal(CONTEXT_PARALLEL_FAMILIES)}", f"spec.roles.{role}.parallel.ulysses: needs a family "
                  f"with a context-parallel plan ({', '.join(CONTEXT_PARALLEL_FAMILIES)}); set ulysses: 1",
                  f".roles.{role}.parallel.ulysses") for role in MODEL_ROLES),
        CelRule(f"{{roles.rollout.parallel.tensor}} == 1 || {{model.family}} in {cel_literal(TENSOR_PARALLEL_FAMILIES)}",
                f"spec.roles.rollout.parallel.tensor: needs a family with a tensor-parallel plan "
                f"({', '.join(TENSOR_PARALLEL_FAMILIES)}); set tensor: 1 (or use ulysses)",
                ".roles.rollout.parallel.tensor"),
        CelRule("{roles.rollout.parallel.tensor} == 1 || !{model.lora.enabled}", "spec.roles.rollout.parallel.tensor: "
                "cannot be combined with model.lora.enabled (diffusers refuses to split a transformer wrapped by LoRA "
                "adapters); use parallel.ulysses, or train all weights", ".roles.rollout.parallel.tensor"),
        CelRule("!{model.compile} || ({roles.rollout.parallel.ulysses} * {roles.rollout.parallel.tensor} * "
                "{roles.actor.parallel.ulysses} == 1)", "spec.model.compile: not with parallel.ulysses or "
                "parallel.tensor > 1 (compiled blocks under diffusers' parallel hooks are not checked yet); set "
                "compile: false", ".model.compile"),
        CelRule("!has(self.model) || !has(self.model.resolution) || !has(self.model.resolutions)",
                "spec.model.resolutions: cannot be set together with model.resolution; keep one",
                ".model.resolutions"),
        *(CelRule(f"{{model.family}} != '{f}' || !has(self.model) || "
                  "(!has(self.model.resolution) && !has(self.model.resolutions))", "spec.model.resolution, "
                  f"spec.model.resolutions: must be null for {f} ({FAMILIES[f].notes.get('sized', 'it has no size')}); "
                  "remove them", ".model") for f in UNSIZED_FAMILIES),
        *(CelRule(f"{{model.family}} != '{f}' || {{algorithm.sampling.guidanceScale}} == 1.0",
                  f"spec.algorithm.sampling.guidanceScale: must be 1 for {f} "
                  f"({FAMILIES[f].notes.get('guidance', 'it has no guidance')})", ".algorithm.sampling.guidanceScale")
          for f in UNGUIDED_FAMILIES),
        CelRule(f"{{model.family}} in {cel_literal(BUILTIN_FAMILIES)} || {{model.path}} != 'builtin'",
                "spec.model.path: must name a model directory for this family (builtin, the default, is "
                f"{', '.join(BUILTIN_FAMILIES)} only)", ".model.path"),
        CelRule(f"{{roles.rollout.batching}} != 'packed' || {{model.family}} in {cel_literal(PACKED_FAMILIES)}",
                f"spec.roles.rollout.batching: packed needs a family that packs mixed shapes into one forward "
                f"({', '.join(PACKED_FAMILIES)}); use batching stepwise", ".roles.rollout.batching"),
        CelRule(f"{{model.attention}} != 'cudnn' || {{model.family}} in {cel_literal(CUDNN_FAMILIES)}",
                f"spec.model.attention: cudnn is checked for families {', '.join(CUDNN_FAMILIES)} only; set auto or "
                "torch", ".model.attention"),
        CelRule("{model.attention} != 'cudnn' || ({roles.rollout.accelerator.type} == 'nvidia' && "
                "{roles.actor.accelerator.type} == 'nvidia')", "spec.model.attention: cudnn runs on NVIDIA GPUs only "
                "(roles.rollout and roles.actor accelerator.type nvidia); set auto or torch", ".model.attention"),
        CelRule("{model.attention} != 'cudnn' || {model.dtype} != 'float32'", "spec.model.attention: cudnn needs "
                "model.dtype bfloat16; set the dtype, or attention auto or torch", ".model.attention"),
        CelRule(f"{{transferQueue.maxStreamLength}} >= {{algorithm.promptsPerStep}} * {{algorithm.groupSize}} * "
                f"{GROUP_ATTEMPTS} + (has(self.data.validationPrompts) ? {{validation.maxPrompts}} : 0)",
                f"spec.transferQueue.maxStreamLength: must be >= algorithm.promptsPerStep × algorithm.groupSize × "
                f"{GROUP_ATTEMPTS} attempts (+ validation.maxPrompts with validationPrompts), what the controller "
                "holds in a stream at once; raise it", ".transferQueue.maxStreamLength"),
        CelRule("!has(self.model) || !has(self.model.resolution) || "
                "(self.model.resolution[0] % 16 == 0 && self.model.resolution[1] % 16 == 0)",
                "spec.model.resolution: must be multiples of 16 (VAE 8x times patch 2)", ".model.resolution"),
    )

    @model_validator(mode="after")
    def _check(self) -> RLJobSpec:
        first: dict[str, int] = {}
        for i, r in enumerate(self.reward):
            if r.name in first:
                raise FieldProblem(f"reward[{i}].name", r.name, f"must be unique; reward[{first[r.name]}] has it")
            first[r.name] = i
        if all(r.weight == 0 for r in self.reward):  # every sample's reward 0: every advantage 0, nothing learnt
            raise FieldProblem("reward", [f"{r.name}: weight 0" for r in self.reward], "every weight is 0, so every "
                               "sample's reward is 0 and nothing is learnt; give at least one reward a non-zero weight")
        if self.data.validationPrompts and all(r.kind in GROUP_KINDS for r in self.reward):
            # validation samples one image per prompt: a group-level scorer has no group to score, and the
            # held-out reward came out 0 for every sample, a reward nobody gave
            raise FieldProblem("data.validationPrompts", self.data.validationPrompts, "needs a per-sample reward: "
                               f"validation scores single samples and every reward is group-level "
                               f"({', '.join(r.kind for r in self.reward)}); add one (e.g. kind ocr) or remove "
                               "validationPrompts")
        actor = self.roles.actor
        check_storage(self.storage, -(-actor_world(actor.replicas, actor.parallel) // max(actor.accelerator.count, 1)))
        self._check_layouts()
        judges: dict[str, int] = {}
        for i, r in enumerate(self.reward):
            if r.server is None:
                continue
            dns = r.name.replace("_", "-")
            if dns in judges:
                raise FieldProblem(f"reward[{i}].name", r.name, f"names the same judge server as reward[{judges[dns]}] "
                                   "('_' becomes '-' in Kubernetes names); rename one")
            judges[dns] = i
        if self.model.resolution is not None and self.model.resolutions:
            raise FieldProblem("model.resolutions", [list(r) for r in self.model.resolutions],
                               "cannot be set together with model.resolution: keep one (a list of one size is "
                               "model.resolution)")
        family = FAMILIES[self.model.family]
        if not family.sized:
            for field, value in (("resolution", self.model.resolution), ("resolutions", self.model.resolutions)):
                if value is not None:
                    raise FieldProblem(f"model.{field}", _as_lists(value), f"must be null for {family.name} "
                                       f"({family.notes.get('sized', 'it has no size')}); remove it")
        if not family.guidance and self.algorithm.sampling.guidanceScale != 1.0:
            raise FieldProblem("algorithm.sampling.guidanceScale", self.algorithm.sampling.guidanceScale,
                               f"must be 1 for {family.name} ({family.notes.get('guidance', 'it has no guidance')})")
        if not family.builtin and self.model.path == "builtin":
            raise FieldProblem(
                "model.path",
                "builtin",
                f"must name a model directory for family {self.model.family} (builtin, the default, is "
                f"{', '.join(BUILTIN_FAMILIES)} only)",
            )
        for i, r in enumerate(self.reward):
            reads = getattr(r.typed_params(), "reads", None)  # a remote scorer or judge: what its params send it
            scored = tuple(reads()) if reads is not None else REWARD_KINDS[r.kind].modalities
            if set(scored) - set(family.modalities):  # a kind reading video and audio needs both (docs/omni.md)
                raise FieldProblem(f"reward[{i}].kind", r.kind, f"scores {' and '.join(scored)}, and model.family "
                                   f"{family.name} produces {' and '.join(family.modalities)}: choose a reward kind "
                                   "that scores what the model produces")
        if self.roles.rollout.batching == "packed" and self.model.family not in PACKED_FAMILIES:
            raise FieldProblem("roles.rollout.batching", "packed", f"needs a family that packs mixed shapes into one "
                               f"forward ({', '.join(PACKED_FAMILIES)}); model.family is {self.model.family}: use "
                               "batching stepwise")
        if self.model.attention not in family.attention:
            why = f"; {family.notes[self.model.attention]}" if self.model.attention in family.notes else ""
            checked = families_with("attention", self.model.attention)
            raise FieldProblem("model.attention", self.model.attention, f"is checked for families {', '.join(checked)} "
                               f"only (model.family is {self.model.family}{why}): set auto or torch")
        if self.model.attention == "cudnn":
            for role in MODEL_ROLES:
                kind = getattr(self.roles, role).accelerator.type
                if kind != "nvidia":
                    raise FieldProblem("model.attention", "cudnn", f"runs on NVIDIA GPUs only; roles.{role}.accelerator"
                                       f".type is {kind}: set auto (cuDNN where it applies) or torch")
            if self.model.dtype == "float32":
                raise FieldProblem("model.attention", "cudnn", "needs model.dtype bfloat16 (it is float32): "
                                   "set the dtype, or attention auto or torch")
        self._check_stream_length()
        sizes = [("model.resolution", self.model.resolution)] + [
            (f"model.resolutions[{i}]", r) for i, r in enumerate(self.model.resolutions or ())]
        for field, res in sizes:
            if res is not None and (res[0] % 16 or res[1] % 16):
                raise FieldProblem(field, list(res), "must be multiples of 16 (VAE 8x times patch 2); use "
                                   f"e.g. [{res[0] // 16 * 16 or 16}, {res[1] // 16 * 16 or 16}]")
        return self


    def _check_layouts(self) -> None:
        """The model roles' `parallel` degrees against what the family can take (docs/parallel.md): a
        context-parallel plan for Ulysses, a tensor-parallel plan for DiT TP, encoder TP plans. The heads'
        divisibility needs the model's config: `omnirl.models.parallel.check_layout`."""
        family = self.model.family
        for role in MODEL_ROLES:
            layout = getattr(self.roles, role).parallel
            # encoderTensor divides ulysses × tensor, so a family that takes those has text encoders to split;
            # whether its encoder's architecture has a plan is read from its config (`check_layout`)
            for field, degree, families, what in (
                    ("ulysses", layout.ulysses, CONTEXT_PARALLEL_FAMILIES, "a context-parallel plan"),
                    ("tensor", layout.tensor, TENSOR_PARALLEL_FAMILIES, "a tensor-parallel plan")):
                if degree > 1 and family not in families:
                    raise FieldProblem(f"roles.{role}.parallel.{field}", degree, f"needs a family with {what} "
                                       f"({', '.join(families)}); model.family is {family}: set {field}: 1")
        if self.roles.rollout.parallel.tensor > 1 and self.model.lora.enabled:
            raise FieldProblem("roles.rollout.parallel.tensor", self.roles.rollout.parallel.tensor, "cannot be combined "
                               "with model.lora.enabled: diffusers refuses to split a transformer wrapped by LoRA "
                               "adapters; use parallel.ulysses (every rank holds the adapters whole) or train all "
                               "weights")
        degrees = (self.roles.rollout.parallel.ranks, self.roles.actor.parallel.ulysses)
        if self.model.compile and max(degrees) > 1:
            raise FieldProblem("model.compile", True, "not with parallel.ulysses or parallel.tensor > 1 (compiled "
                               "blocks under diffusers' parallel hooks are not checked yet): set compile: false")

    def _check_stream_length(self) -> None:
        """`transferQueue.maxStreamLength` must hold what the controller keeps in a stream at once: a
        step's scores stay there until the whole step is collected, those of every attempt of a group
        (a refilled group's first scores too: promptsPerStep × groupSize × GROUP_ATTEMPTS), and a
        validation round's requests go out in one go (maxPrompts). Below that the producers wait on a
        controller that waits on them: every role stalls until the back-pressure timeout fails it."""
        algo = self.algorithm
        needed = algo.promptsPerStep * algo.groupSize * GROUP_ATTEMPTS
        rounds = self.validation.maxPrompts if self.data.validationPrompts else 0
        if self.transferQueue.maxStreamLength < needed + rounds:
            held = (f"promptsPerStep × groupSize × {GROUP_ATTEMPTS} attempts = {algo.promptsPerStep} × {algo.groupSize}"
                    f" × {GROUP_ATTEMPTS} scores of a step whose groups are all refilled")
            held += f" + validation.maxPrompts = {rounds} requests of a validation round" if rounds else ""
            raise FieldProblem("transferQueue.maxStreamLength", self.transferQueue.maxStreamLength,
                               f"must be >= {needed + rounds}, what the controller holds in a stream at once ({held}); "
                               "below it the roles wait on each other until the back-pressure timeout; raise it")


DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_LABEL_RULE = ("a DNS-1123 label: at most 63 characters, lowercase letters, digits and '-', starting and "
                      "ending with a letter or digit")


def _as_lists(value: Any) -> Any:
    """A size or list of sizes as JSON lists (tuples print as lists in messages)."""
    return [_as_lists(v) for v in value] if isinstance(value, (list, tuple)) else value


def is_dns1123_label(text: str) -> bool:
    """Whether `text` is a valid Kubernetes namespace (a DNS-1123 label, `DNS1123_LABEL_RULE`)."""
    return len(text) <= 63 and re.fullmatch(DNS1123_LABEL, text) is not None


# Longest child name is the actor StatefulSet `<job>-actor`: the StatefulSet controller labels its
# pods `controller-revision-hash: <name>-<10-char hash>`, and a label value holds 63 characters,
# so the StatefulSet name may hold 52 and the job name 52 - len("-actor") = 46.
MAX_JOB_NAME = 46
# The job's Services (`<job>-actor`, `<job>-judge-<reward>` ...) are DNS-1035 labels: they start with a letter.
DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
JOB_NAME_RULE = (f"at most {MAX_JOB_NAME} characters, lowercase letters, digits and '-', starting with a letter "
                 "and ending with a letter or digit (the job's Services are named after it)")


def judge_service_name(job_name: str, reward_name: str) -> str:
    """`<job>-judge-<reward>`: Deployment and Service of a judge server (`_` is not allowed there: `-`)."""
    return f"{job_name}-judge-{reward_name.replace('_', '-')}"


class ObjectMeta(SpecModel):
    """The part of Kubernetes `metadata` omnirl reads; other fields are kept as they are."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str = Field(
        ...,
        description=f"Job name: {JOB_NAME_RULE}.",
    )
    namespace: str | None = Field(None, description="Namespace: a DNS-1123 label (`DNS1123_LABEL_RULE`).")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        # the rule's own words, not the regular expression
        if len(value) > MAX_JOB_NAME:
            raise ValueError(f"must be at most {MAX_JOB_NAME} characters (it has {len(value)}): the actor "
                             f"StatefulSet `{value}-actor` labels its pods with its name plus an 11-character "
                             "revision hash, and label values hold 63 characters")
        if re.fullmatch(DNS1035_LABEL, value) is None:
            raise ValueError(f"must be {JOB_NAME_RULE} (e.g. ocr-nft-1)")
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str | None) -> str | None:
        # the rule's own words (as `omnirl render --namespace` says them), not the regular expression
        if value is not None and not is_dns1123_label(value):
            raise ValueError(f"must be {DNS1123_LABEL_RULE} (e.g. team-a)")
        return value


class RLJob(SpecModel):
    """A whole RLJob manifest (apiVersion, kind, metadata, spec); status is carried, not validated."""

    apiVersion: Literal["omnirl.dev/v1alpha1"] = Field(f"{API_GROUP}/{API_VERSION}")
    kind: Literal["RLJob"] = Field(KIND)
    metadata: ObjectMeta
    spec: RLJobSpec
    status: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_judge_names(self) -> RLJob:
        # needs metadata.name, so here rather than in RLJobSpec (which refuses clashing judge names)
        for i, r in enumerate(self.spec.reward):
            name = judge_service_name(self.metadata.name, r.name)
            if r.server is not None and (len(name) > 63 or re.fullmatch(DNS1035_LABEL, name) is None):
                raise FieldProblem(f"spec.reward[{i}].name", r.name, f"names the judge Service {name!r} "
                                   f"({len(name)} characters), which must be a DNS-1035 label of at most 63 "
                                   "characters ending with a letter or digit: shorten or change the reward or job name")
        return self


RewardSpec.model_rebuild()  # `server` refers to RewardServerSpec, defined after it
