"""The `spec.algorithm` part of an RLJob: sampler, advantages, optimiser, FlowGRPO, DiffusionNFT, AWM, DGPO.

`ALGORITHMS` is the algorithm registry, the one owner of the names `algorithm.name` accepts: each
name → the `AlgorithmSpec` field holding its settings and where its two halves live: its rollout plan (an
`omnirl.algorithms.plan.Planner`, imported by `planner_for`: the controller's) and its update (an
`omnirl.actor.algorithm.Algorithm`, imported by `omnirl.actor.algorithm.algorithm_for`). Adding an
algorithm = its settings class here, its implementation module, one registry line.

Split from `omnirl.api.spec` (which re-exports every class here) to keep files small. Defaults
follow the published recipes: Flow-GRPO (arXiv 2505.05470), DiffusionNFT (arXiv 2509.16117) and
Advantage Weighted Matching (arXiv 2509.25050, its authors' SD3.5 OCR config) and DGPO (arXiv
2510.08425, its authors' OCR config); see `references/algorithms.md`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from omnirl.api._base import CelRule, SpecModel
from omnirl.api.errors import FieldProblem

_UnitFloat = Annotated[float, Field(gt=0, lt=1)]
_Beta = Annotated[float, Field(ge=0, lt=1)]
_StepIndex = Annotated[int, Field(ge=0)]
_Positive = Annotated[float, Field(gt=0)]


@dataclass(frozen=True)
class AlgorithmEntry:
    """One registered algorithm.

    Attributes:
        settings: the `AlgorithmSpec` field holding its parameters (an `AlgorithmSettings`), or
            None for an algorithm without parameters.
        implementation: `"module:attribute"` of its `omnirl.actor.algorithm.Algorithm` object (a
            string: the spec stays torch-free and below the runtime in the import layers).
        plan: `"module:attribute"` of its `omnirl.algorithms.plan.Planner` (what the controller sends
            rollout each step); default: the ODE rollout.
    """

    settings: str | None
    implementation: str
    plan: str = "omnirl.algorithms.plan:ODE"


ALGORITHMS: dict[str, AlgorithmEntry] = {
    "flow-grpo": AlgorithmEntry("flowGrpo", "omnirl.actor.flow_grpo_update:FLOW_GRPO", "omnirl.algorithms.plan:FLOW_GRPO"),
    "diffusion-nft": AlgorithmEntry("nft", "omnirl.actor.nft_update:DIFFUSION_NFT"),
    "awm": AlgorithmEntry("awm", "omnirl.actor.awm_update:AWM"),
    "dgpo": AlgorithmEntry("dgpo", "omnirl.actor.dgpo_update:DGPO"),
}


class AlgorithmSettings(SpecModel):
    """Base of one algorithm's settings block; `check_job` adds checks against the rest of the job."""

    def check_job(self, algo: AlgorithmSpec) -> None:
        """Cross-field checks run when this algorithm is the job's; raise `FieldProblem` with a path
        relative to `spec.algorithm`. Default: nothing to check."""


class SamplingSpec(SpecModel):
    """The rollout sampler's σ grid."""

    numSteps: int = Field(10, ge=2, le=1000, description="Denoising steps per rollout sample.")
    shift: float | None = Field(
        None, gt=0, description="Override of the model family's σ grid: σ_k = 1 − k/numSteps, shifted SD3-style "
        "σ' = shift·σ/(1 + (shift − 1)·σ) (1 = no shift). Unset: the family's own grid (ocr-digits: shift 1; "
        "diffusers families: their scheduler config's grid). `omnirl validate` prints the grid a job uses.")
    guidanceScale: float = Field(
        1.0, ge=1.0, description="Classifier-free guidance weight (SD3, Qwen-Image; 1 disables CFG), or FLUX.1-dev's "
        "embedded guidance value (1 keeps the model's default, 3.5). Rollout and training use the same guided velocity.")


class AdvantageSpec(SpecModel):
    """Group-relative advantages A = (r − mean_group) / (std + eps), clamped to ±clip."""

    stdMode: Literal["group", "global"] = Field(
        "group", description="Normalise rewards by the group's std or by the whole batch's std."
    )
    eps: float = Field(1e-4, gt=0, description="Added to the std before dividing (reward units).")
    clip: float = Field(5.0, gt=0, description="Advantages are clamped to ±clip (dimensionless).")


class WindowSpec(SpecModel):
    """The window of stochastic, trained denoising steps (Flow-GRPO); the other steps are ODE steps."""

    size: int = Field(2, ge=1, description="Number of consecutive stochastic (trained) denoising steps.")
    range: tuple[_StepIndex, _StepIndex] = Field(
        (0, 5),
        description="[lo, hi): 0-based step indices the window may start at and must end before; the start "
        "is seeded per training step so every member of a group shares it. hi must be <= "
        "sampling.numSteps - 1 (the last denoising step is never trained).",
    )
    cel_rules = (
        CelRule("{range}[0] < {range}[1]", "spec.algorithm.flowGrpo.window.range: must satisfy lo < hi", ".range"),
        CelRule("{size} <= {range}[1] - {range}[0]", "spec.algorithm.flowGrpo.window.size: must be <= hi - lo of "
                "window.range", ".size"),
    )

    @model_validator(mode="after")
    def _check(self) -> WindowSpec:
        lo, hi = self.range
        if lo >= hi:
            raise FieldProblem("range", list(self.range), "must satisfy lo < hi")
        if self.size > hi - lo:
            raise FieldProblem("size", self.size, f"must be <= hi - lo = {hi - lo} (window.range {[lo, hi]})")
        return self


class RSSpec(SpecModel):
    """Rejection-sampling mask on the sequence-level importance weight w = exp(Σ log-ratio)."""

    enabled: bool = Field(False, description="Zero the loss weight of samples whose IS weight leaves the band.")
    auto: bool = Field(
        True, description="Pick the band from the observed IS-weight distribution; `band` is then ignored."
    )
    band: tuple[_Positive, _Positive] = Field(
        (0.5, 2.0),
        description="[lo, hi] band of the IS weight w (dimensionless, 0 < lo < 1 < hi) used when auto is false.",
    )
    cel_rules = (CelRule("{band}[0] < 1.0 && {band}[1] > 1.0", "spec.algorithm.flowGrpo.rolloutCorrection.rejectionSampling.band: "
                         "must satisfy 0 < lo < 1 < hi (w = 1 is on-policy)", ".band"),)

    @model_validator(mode="after")
    def _check(self) -> RSSpec:
        lo, hi = self.band
        if not lo < 1.0 < hi:
            raise FieldProblem("band", list(self.band), "must satisfy 0 < lo < 1 < hi (w = 1 is on-policy)")
        return self


class RolloutCorrectionSpec(SpecModel):
    """Where old log-probs come from, plus importance-sampling diagnostics."""

    mode: Literal["recompute", "bypass"] = Field(
        "recompute",
        description="`recompute`: old log-probs from the actor; `bypass`: use the rollout engine's log-probs "
        "(saves a forward pass).",
    )
    rejectionSampling: RSSpec = Field(default_factory=RSSpec, description="RS mask (IS weight band).")


class FlowGRPOSpec(AlgorithmSettings):
    """Flow-GRPO (arXiv 2505.05470) parameters."""

    sdeType: Literal["sde", "cps"] = Field("sde", description="Stochastic sampler: Flow-GRPO SDE or CPS.")
    noiseLevel: float = Field(
        0.7, ge=0, le=2.0, description="SDE noise level a, dimensionless (0.7 for sde, 0.8 for cps)."
    )
    window: WindowSpec = Field(default_factory=WindowSpec, description="Stochastic, trained step window.")
    clipRange: float = Field(
        1e-4,
        gt=0,
        le=1.0,
        description="PPO clip range ε on the per-step ratio (1e-4 … 1e-5: log-probs are per-element means).",
    )
    klCoef: float = Field(0.04, ge=0, description="β of the per-step closed-form Gaussian KL to the reference.")
    rolloutCorrection: RolloutCorrectionSpec = Field(
        default_factory=RolloutCorrectionSpec, description="Old log-prob source and IS/RS diagnostics."
    )

    def check_job(self, algo: AlgorithmSpec) -> None:
        """The window must end before the last denoising step (which is never trained)."""
        last = algo.sampling.numSteps - 1
        lo, hi = self.window.range
        if hi > last:
            raise FieldProblem(
                "flowGrpo.window.range",
                [lo, hi],
                f"hi must be <= sampling.numSteps - 1 = {last} (the last denoising step is never trained)",
            )


class OldPolicySpec(SpecModel):
    """How DiffusionNFT's v_old follows the trained policy."""

    refreshEvery: int = Field(1, ge=1, description="Refresh v_old every k optimiser steps.")
    schedule: Literal["copy", "ema"] = Field("copy", description="Refresh by copy, or by an EMA with ramped decay.")
    decayMax: float = Field(0.999, ge=0, lt=1, description="Final EMA decay for schedule `ema`.")
    rampSteps: int = Field(100, ge=1, description="Optimiser steps over which the EMA decay ramps up.")


class NFTSpec(AlgorithmSettings):
    """DiffusionNFT (arXiv 2509.16117) parameters."""

    beta: float = Field(1.0, gt=0, description="β of the implicit policies v± (1 GenEval/PickScore, 0.1 OCR).")
    advantageMax: float = Field(5.0, gt=0, description="A_max in r = clamp(A/(2·A_max) + 0.5, 0, 1).")
    klCoef: float = Field(0.01, ge=0, description="Weight of the velocity KL ‖v_θ − v_ref‖² to the base model.")
    timestepsPerSample: int = Field(2, ge=1, le=16, description="Stratified σ draws per sample per update.")
    sigmaRange: tuple[_UnitFloat, _UnitFloat] = Field(
        (0.02, 0.98), description="[lo, hi] σ draws are clamped to (0 < lo < hi < 1)."
    )
    cel_rules = (CelRule("{sigmaRange}[0] < {sigmaRange}[1]", "spec.algorithm.nft.sigmaRange: must satisfy "
                         "0 < lo < hi < 1", ".sigmaRange"),)
    oldPolicy: OldPolicySpec = Field(default_factory=OldPolicySpec, description="v_old refresh schedule.")

    @model_validator(mode="after")
    def _check(self) -> NFTSpec:
        return _ordered_sigma_range(self)


def _ordered_sigma_range(spec: NFTSpec | MatchingDraws) -> NFTSpec | MatchingDraws:
    lo, hi = spec.sigmaRange
    if lo >= hi:
        raise FieldProblem("sigmaRange", list(spec.sigmaRange), "must satisfy 0 < lo < hi < 1")
    return spec


def _awm_anchor() -> OldPolicySpec:
    return OldPolicySpec(refreshEvery=1, schedule="ema", decayMax=0.3, rampSteps=300)


class MatchingDraws(AlgorithmSettings):
    """Where a velocity-matching update re-noises x0 (AWM, DGPO): K draws (σ, ε) per sample per update."""

    timestepsPerSample: int = Field(
        6, ge=1, le=64, description="Training timesteps per sample per update (paper: 6). Each draw re-noises "
        "x0 at one σ: x_σ = (1−σ)·x0 + σ·ε; a micro-batch's draws share one forward of K × microBatchSize rows.")
    timeSampling: Literal["grid", "uniform"] = Field(
        "grid", description="Where the σ draws come from. `grid` (paper: discrete_wo_init): one index per "
        "stratum of the rollout σ grid's steps [1, ⌊numSteps·timestepFraction⌋), σ = that grid value (skips "
        "σ = 1). `uniform`: one σ per stratum of sigmaRange, uniform inside it.")
    timestepFraction: float = Field(
        0.9, gt=0, le=1, description="`grid` only: train on the first ⌊numSteps·fraction⌋ grid steps "
        "(paper: 0.9, never the nearly clean tail).")
    sigmaRange: tuple[_UnitFloat, _UnitFloat] = Field(
        (0.02, 0.98), description="`uniform` only: [lo, hi] the σ draws are stratified over (0 < lo < hi < 1).")
    groupSharedNoise: bool = Field(
        False, description="Every member of a group shares each draw's σ and ε (the advantage-weighted common "
        "part then cancels: lower-variance gradient). Paper: false (ε per sample, σ per micro-batch); σ is "
        "always shared within a group here.")
    cel_rules = (CelRule("{sigmaRange}[0] < {sigmaRange}[1]", "spec.algorithm.awm.sigmaRange, "
                         "spec.algorithm.dgpo.sigmaRange: must satisfy 0 < lo < hi < 1", ".sigmaRange"),)

    @model_validator(mode="after")
    def _check_range(self) -> MatchingDraws:
        return _ordered_sigma_range(self)

    def check_job(self, algo: AlgorithmSpec) -> None:
        """`grid` time sampling needs at least two grid steps to draw from."""
        if self.timeSampling == "grid" and int(algo.sampling.numSteps * self.timestepFraction) < 2:
            raise FieldProblem(f"{ALGORITHMS[algo.name].settings}.timestepFraction", self.timestepFraction,
                               f"leaves no grid step to train with sampling.numSteps = {algo.sampling.numSteps} "
                               "(need ⌊numSteps·fraction⌋ >= 2)")


class AWMSpec(MatchingDraws):
    """Advantage Weighted Matching (arXiv 2509.25050) parameters; defaults = the authors' SD3.5 OCR recipe.

    Sampler: rollouts use the deterministic (ODE, Euler) sampler of `sampling` from the current
    policy — AWM needs no likelihoods, only the clean x0 and the prompt. (The authors roll out
    with SA-Solver, noise 0.4, 14 steps; any solver is valid, the loss never looks at the path.)
    """

    weighting: Literal["uniform", "t", "t2", "huber", "ghuber"] = Field(
        "ghuber", description="w(ℓ, σ) applied to the per-sample matching error ℓ = mean (v_θ − (ε − x0))²: "
        "uniform ℓ; t σ·ℓ; t2 σ²·ℓ; huber σ·(√(ℓ+δ) − δ); ghuber σ/p·((ℓ+δ)^p − δ^p), δ = 1e-10 (paper: ghuber).")
    ghuberPower: float = Field(0.25, gt=0, le=1, description="p of the `ghuber` weighting (paper: 0.25).")
    advantageMax: float = Field(
        1.0, gt=0, description="Advantages (already clamped to ±advantage.clip) are rescaled to "
        "±advantageMax: A·advantageMax/advantage.clip (paper: 1 with clip 5, so A ∈ [−1, 1]).")
    clipRange: float = Field(
        1.0, gt=0, description="PPO clip ε on ratio = exp(log p − log p_old), log p = −w(ℓ, σ) (paper: 1, i.e. "
        "off; the ratio is exactly 1 with one optimiser step per batch).")
    klCoef: float = Field(
        0.003, ge=0, description="Weight of the velocity KL mean (v_θ − v_ref)² to the base model (paper: 0.003).")
    emaKlCoef: float = Field(
        1.0, ge=0, description="Weight of the velocity KL mean (v_θ − v_ema)² to the EMA anchor (paper: 1; "
        "0 drops the anchor and its second copy of the weights).")
    anchor: OldPolicySpec = Field(
        default_factory=_awm_anchor, description="EMA anchor refresh θ_ema ← d·θ_ema + (1−d)·θ after every "
        "`refreshEvery` optimiser steps, d = min(decayMax, steps/rampSteps·decayMax) (paper: min(0.3, "
        "0.001·steps): schedule ema, decayMax 0.3, rampSteps 300).")



class DGPOSpec(MatchingDraws):
    """Direct Group Preference Optimization (DGPO, arXiv 2510.08425) parameters.

    ODE rollouts of θ; per draw, a group's preference statistic s = β/G·Σ_j A_j·(ℓ_θ,j − ℓ_ref,j)
    (ℓ = mean (v − (ε − x0))², the reference the base model or the EMA anchor) weights every member's
    matching error: loss = mean σ(s)·A·ℓ_θ (+ klCoef · the velocity KL to the base model) — the
    gradient of −log σ(−s), the group-level Bradley–Terry likelihood, up to the factor β.
    """

    betaDpo: float = Field(
        100.0, gt=0, description="β of the group preference σ(β/G·Σ A·(ℓ_θ − ℓ_ref)) (authors: 100 with the base "
        "model as reference, 2000 with the EMA reference); larger → sharper group weights.")
    reference: Literal["base", "ema"] = Field(
        "base", description="The ℓ_ref of the preference: the frozen base model (`base`, authors' default) or the "
        "EMA anchor θ_ema refreshed by `anchor` (`ema`).")
    klCoef: float = Field(1e-3, ge=0, description="Weight of the velocity KL mean (v_θ − v_base)² (authors: 1e-3).")
    anchor: OldPolicySpec = Field(
        default_factory=_awm_anchor, description="`reference: ema` only: θ_ema ← d·θ_ema + (1−d)·θ after every "
        "`refreshEvery` optimiser steps, d = min(decayMax, steps/rampSteps·decayMax) (authors: min(0.3, 0.001·steps)).")


class OptimizerSpec(SpecModel):
    """AdamW settings and how a training step's batch is split."""

    learningRate: float = Field(1e-4, gt=0, description="AdamW learning rate.")
    weightDecay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[_Beta, _Beta] = Field((0.9, 0.999), description="AdamW (beta1, beta2), each in [0, 1).")
    gradClip: float = Field(1.0, gt=0, description="Max global gradient L2 norm.")
    updatesPerStep: int = Field(
        1,
        ge=1,
        le=64,
        description="Optimiser steps per training step: the batch is split into this many "
        "equal minibatches (must divide promptsPerStep × groupSize).",
    )
    microBatchSize: int = Field(
        8, ge=1, description="Samples per forward/backward, never exceeded; gradients accumulate over a minibatch. "
        "DiffusionNFT and AWM keep a group in one micro-batch when it fits and otherwise cut it: their σ and noise "
        "are drawn per group id, not per micro-batch, so the update is the same either way."
    )


class AlgorithmSpec(SpecModel):
    """The RL algorithm and its settings."""

    name: str = Field(
        "flow-grpo", description="RL algorithm: FlowGRPO, DiffusionNFT, Advantage Weighted Matching or Direct Group "
        "Preference Optimization.",
        json_schema_extra={"enum": list(ALGORITHMS)})
    steps: int = Field(100, ge=1, description="Training steps (one batch of promptsPerStep × groupSize samples each).")
    groupSize: int = Field(
        8, ge=2, le=1024, description="Samples per prompt (G), sharing the prompt's advantage baseline."
    )
    promptsPerStep: int = Field(8, ge=1, description="Prompts drawn per training step.")
    sampling: SamplingSpec = Field(default_factory=SamplingSpec, description="Rollout sampler.")
    advantage: AdvantageSpec = Field(default_factory=AdvantageSpec, description="Group advantages.")
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec, description="Optimiser.")
    flowGrpo: FlowGRPOSpec = Field(default_factory=FlowGRPOSpec, description="FlowGRPO parameters (name flow-grpo).")
    nft: NFTSpec = Field(default_factory=NFTSpec, description="DiffusionNFT parameters (name diffusion-nft).")
    awm: AWMSpec = Field(default_factory=AWMSpec, description="Advantage Weighted Matching parameters (name awm).")
    dgpo: DGPOSpec = Field(default_factory=DGPOSpec, description="Direct Group Preference Optimization parameters "
                           "(name dgpo).")
    cel_rules = (
        *(CelRule(f"!has(self.{e.settings}) || {{name}} == '{n}'", f"spec.algorithm.{e.settings}: set, but "
                  f"algorithm.name is not {n}, which ignores it: remove algorithm.{e.settings}, or set algorithm.name: "
                  f"{n}", f".{e.settings}") for n, e in ALGORITHMS.items() if e.settings is not None),
        CelRule("{promptsPerStep} * {groupSize} % {optimizer.updatesPerStep} == 0", "spec.algorithm.optimizer."
                "updatesPerStep: must divide the batch of promptsPerStep × groupSize samples",
                ".optimizer.updatesPerStep"),
        CelRule("{name} != 'flow-grpo' || {flowGrpo.window.range}[1] <= {sampling.numSteps} - 1",
                "spec.algorithm.flowGrpo.window.range: hi must be <= sampling.numSteps - 1 (the last denoising step "
                "is never trained)", ".flowGrpo.window.range"),
        *(CelRule(f"{{name}} != '{n}' || {{{e.settings}.timeSampling}} != 'grid' || "
                  f"int(double({{sampling.numSteps}}) * {{{e.settings}.timestepFraction}}) >= 2",
                  f"spec.algorithm.{e.settings}.timestepFraction: leaves no grid step to train with sampling.numSteps "
                  "(need floor(numSteps × fraction) >= 2); raise it or sampling.numSteps",
                  f".{e.settings}.timestepFraction")
          for n, e in ALGORITHMS.items() if e.settings in ("awm", "dgpo")),
    )

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        if name not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {name!r}: use one of {', '.join(ALGORITHMS)}")
        return name

    def settings(self) -> AlgorithmSettings | None:
        """The selected algorithm's settings block (`ALGORITHMS[name].settings`), None if it has none."""
        field = ALGORITHMS[self.name].settings
        return None if field is None else getattr(self, field)

    def unused_blocks(self) -> list[str]:
        """The settings fields of the other registered algorithms (`nft`, `awm` ... for flow-grpo):
        ignored by this job, left out of `omnirl.api.loader.dump_rljob`."""
        own = ALGORITHMS[self.name].settings
        return [e.settings for e in ALGORITHMS.values() if e.settings is not None and e.settings != own]

    @model_validator(mode="after")
    def _check(self) -> AlgorithmSpec:
        # A block that was written is refused even when it equals the defaults: whoever wrote
        # `nft: {beta: 1.0}` believes it takes effect (most likely they forgot to change `name`),
        # and it cannot. Blocks left out keep their defaults silently (`model_fields_set`).
        for field in self.unused_blocks():
            if field in self.model_fields_set:
                owner = next(n for n, e in ALGORITHMS.items() if e.settings == field)
                raise FieldProblem(
                    field, getattr(self, field).model_dump(mode="json", exclude_unset=True),
                    f"algorithm.{field} is set but algorithm.name is {self.name}, which ignores it: remove "
                    f"algorithm.{field}, or set algorithm.name: {owner}")
        own = self.settings()
        if own is not None:
            own.check_job(self)
        batch = self.promptsPerStep * self.groupSize
        if batch % self.optimizer.updatesPerStep:
            raise FieldProblem(
                "optimizer.updatesPerStep",
                self.optimizer.updatesPerStep,
                f"must divide the batch of promptsPerStep × groupSize = {batch} samples",
            )
        return self
