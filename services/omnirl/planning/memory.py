"""Per-device memory of every model role of a job under its `parallel` layout (docs/parallel.md, "Memory plan").

What one device holds, in bytes (b = bytes per parameter of `model.dtype`; P the transformer's parameters, P_e
the text encoders', P_o the other components' (VAEs, vocoder, connectors); U, T, E the layout's ulysses, tensor
and encoderTensor; F the actor's FSDP degree, replicas × ulysses / replicate; S a sample's tokens,
`tokens.sample_tokens`; a(S) the activation bytes per token per layer, `activations.bytes_per_token_layer`):

rollout rank
    weights P·b/T (+ LoRA adapters whole) · text encoders P_e·b/E (their split layers; embeddings, norms
    and vision towers whole) · other components P_o·b
    activations: one layer's saves over the forward's rows, rows·(S/U)·a, rows = maxBatchSize (×2 with CFG)
    latents in flight: maxBatchSize · (window + 2) · latent elements · 4 (fp32 trajectories)
    weight-sync receive bucket: 64 MiB (`WeightSender`'s bucket)
actor rank
    weights P·b/F · FSDP2's gathered units 2 · (largest block) (this one and the prefetched next)
    reference / old copies: each P·b/F (full fine-tuning), or LoRA adapters (θ's and the old policy's, /F)
    gradients and AdamW's two moments: 3 · trainable·b/F. `torch.optim.AdamW` keeps exp_avg and exp_avg_sq per
        parameter, `zeros_like` the parameter (its dtype: no float32 master copy, the weights train in
        `model.dtype`); the gradients of a minibatch's first micro-batches stay alive under the next one's
        activations (`optimizer.zero_grad(set_to_none=True)` only before each minibatch), so at the steady state's
        peak, the start of a backward, weights, gradients, both moments and every activation are held at once.
        (A measured first step, `plan_check`, holds neither: the moments are made in the first `step()`, the
        gradients in the backward. Its peak is lower by these 3 · trainable·b/F.)
    the AdamW step's temporary beyond the activations: max(0, trainable·b/F − activations). The step runs
        after the backward has freed the activations; the foreach implementation (CUDA's default) allocates
        √(exp_avg_sq) for every parameter at once (`_multi_tensor_adamw`: `torch._foreach_sqrt`), one more
        trainable·b/F. It raises the peak only where it is larger than the activations (a full fine-tune with
        gradient checkpointing and short samples).
    text encoders P_e·b/E · other components P_o·b
    activations: rows·(S/U)·(L·a) for a micro-batch (rows = microBatchSize, ×2 with CFG); with
        `gradientCheckpointing` rows·(S/U)·(L·h·b + a) (block inputs kept, one block recomputed)
    weight sync (rank 0): the 256 MiB gather bucket and the 64 MiB send bucket
both
    a reserve of 2 GiB for what `torch.cuda.max_memory_allocated` does not see (CUDA context, NCCL's buffers,
    the caching allocator's fragmentation), added before the fit.

The sum without the reserve is what the benchmark (`benchmarks/gpu/plan_check.py`) compares with
`torch.cuda.max_memory_allocated` on the H200 (the ±15 % claim, docs/parallel.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

GIB = 2**30
RESERVE = 2 * GIB
SYNC_BUCKET = 64 * 2**20
GATHER_BUCKET = 256 * 2**20


@dataclass
class RolePlan:
    """One role's per-device memory.

    Attributes:
        role: `rollout` or `actor`.
        layout: the layout in words (`ulysses 4 × tensor 1, encoderTensor 2`).
        rows: (what, bytes) per item, reserve excluded.
        capacity: the device's memory, bytes.
    """

    role: str
    layout: str
    rows: list[tuple[str, float]] = field(default_factory=list)
    capacity: float = 0.0

    @property
    def allocated(self) -> float:
        """Bytes the allocator holds at the peak (what `torch.cuda.max_memory_allocated` measures)."""
        return sum(v for _, v in self.rows)

    @property
    def fits(self) -> bool:
        """Allocated + `RESERVE` ≤ capacity."""
        return self.allocated + RESERVE <= self.capacity


@dataclass(frozen=True)
class Model:
    """What the plan reads of a model: its components and per-token facts.

    Attributes:
        family: `spec.model.family`.
        transformer, others: bytes of the transformer, of the components that are not text encoders.
        encoders, encoders_split: bytes of the text encoders that stay whole (embeddings, norms, a vision tower)
            and that encoder tensor parallelism splits (`encoder_tp.encoder_plan`'s layers).
        largest_block: bytes of the transformer's largest block. layers: its blocks.
        hidden: bytes per token of one block's input (its residual streams, b·width, summed over streams
            weighted like `act`).
        act: activation bytes per token per layer per stream (`{"video": ..., "audio": ...}`).
        lora: LoRA adapter bytes (0 without LoRA).
        tokens: a sample's `SampleTokens`.
    """

    family: str
    transformer: float
    encoders: float
    encoders_split: float
    others: float
    largest_block: float
    layers: int
    hidden: dict
    act: dict
    lora: float
    tokens: object


def _per_rank_tokens(model: Model, ulysses: int) -> dict:
    t = model.tokens
    return {"video": math.ceil(t.video / ulysses), "audio": math.ceil(t.audio / ulysses)}


def _act(model: Model, ulysses: int, per_token) -> float:
    return sum(n * per_token(stream) for stream, n in _per_rank_tokens(model, ulysses).items() if n)


def rollout_plan(spec, model: Model, capacity: float, *, cfg: bool, window: int) -> RolePlan:
    """The rollout rank's memory (module docstring)."""
    role = spec.roles.rollout
    lay = role.parallel
    rows_per_forward = role.maxBatchSize * (2 if cfg else 1)
    plan = RolePlan("rollout", f"ulysses {lay.ulysses} × tensor {lay.tensor}, encoderTensor {lay.encoderTensor}",
                    capacity=capacity)
    plan.rows += [
        ("transformer weights" + (f" (1/{lay.tensor})" if lay.tensor > 1 else ""), model.transformer / lay.tensor),
        ("LoRA adapters", model.lora),
        ("text encoders" + (f" (1/{lay.encoderTensor})" if lay.encoderTensor > 1 else ""),
         model.encoders + model.encoders_split / lay.encoderTensor),
        ("VAEs and other components", model.others),
        (f"activations: one layer over {rows_per_forward} rows", rows_per_forward * _act(
            model, lay.ulysses, lambda s: model.act.get(s, 0.0) + 2 * model.hidden.get(s, 0.0))),
        ("latents in flight", role.maxBatchSize * (window + 2) * model.tokens.latent_elements * 4),
        ("weight-sync bucket", SYNC_BUCKET),
    ]
    return plan


def actor_plan(spec, model: Model, capacity: float, *, cfg: bool, copies: int, old_lora: bool) -> RolePlan:
    """The actor rank's memory (module docstring). `copies`: frozen reference/old copies of full weights;
    `old_lora`: an old-policy adapter set beside θ's (LoRA)."""
    from omnirl.api.spec_parallel import fsdp_degree

    role = spec.roles.actor
    lay = role.parallel
    fsdp = fsdp_degree(role.replicas, lay)
    lora = spec.model.lora.enabled
    trainable = model.lora if lora else model.transformer
    rows = spec.algorithm.optimizer.microBatchSize * (2 if cfg else 1)
    checkpointing = spec.model.gradientCheckpointing
    layers = model.layers
    if checkpointing:
        act = rows * _act(model, lay.ulysses, lambda s: layers * model.hidden.get(s, 0.0) + model.act.get(s, 0.0))
        what = f"activations: {rows} rows, block inputs of {layers} layers + one recomputed"
    else:
        act = rows * _act(model, lay.ulysses, lambda s: layers * model.act.get(s, 0.0))
        what = f"activations: {rows} rows × {layers} layers"
    plan = RolePlan("actor", f"{role.replicas} replicas × ulysses {lay.ulysses}, FSDP over {fsdp}"
                    + (f" (HSDP {lay.replicate} groups)" if lay.replicate > 1 else "")
                    + f", encoderTensor {lay.encoderTensor}", capacity=capacity)
    plan.rows += [
        ("transformer weights" + (f" (1/{fsdp})" if fsdp > 1 else ""), model.transformer / fsdp),
        ("FSDP gathered blocks (2)", 2 * model.largest_block if fsdp > 1 else 0.0),
        ("LoRA adapters (θ" + (", old)" if old_lora else ")"),
         model.lora * (2 if old_lora else 1) / fsdp if lora else 0.0),
        ("reference / old copies", copies * model.transformer / fsdp if not lora else 0.0),
        ("gradients + AdamW moments", 3 * trainable / fsdp),
        ("text encoders" + (f" (1/{lay.encoderTensor})" if lay.encoderTensor > 1 else ""),
         model.encoders + model.encoders_split / lay.encoderTensor),
        ("VAEs and other components", model.others),
        (what, act),
        ("AdamW step's √v temporary beyond the activations", max(0.0, trainable / fsdp - act)),
        ("weight-sync buckets (rank 0)", GATHER_BUCKET + SYNC_BUCKET),
    ]
    return plan


def describe(plan: RolePlan, product: str) -> list[str]:
    """The table of one role, GiB, for `omnirl plan`."""
    lines = [f"{plan.role}: {plan.layout}, per device of {product} ({plan.capacity / GIB:.1f} GiB)"]
    width = max(len(what) for what, _ in [*plan.rows, ("allocated (torch.cuda.max_memory_allocated)", 0)])
    lines += [f"  {what:<{width}}  {value / GIB:9.2f} GiB" for what, value in plan.rows]
    lines.append(f"  {'allocated (torch.cuda.max_memory_allocated)':<{width}}  {plan.allocated / GIB:9.2f} GiB")
    lines.append(f"  {'reserve (CUDA context, NCCL, fragmentation)':<{width}}  {RESERVE / GIB:9.2f} GiB")
    total = plan.allocated + RESERVE
    verdict = "fits" if plan.fits else f"DOES NOT FIT (over by {(total - plan.capacity) / GIB:.1f} GiB)"
    lines.append(f"  {'total':<{width}}  {total / GIB:9.2f} GiB  {verdict}")
    return lines
