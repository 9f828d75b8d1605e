"""A job's memory plan: read the model's configs, measure its activations, fit every model role into its device,
and search the layouts that would fit (`omnirl plan`, `omnirl validate`)."""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from omnirl.api.spec_parallel import DEFAULT_PRODUCT, GPU_MEMORY_GIB
from omnirl.planning.memory import GIB, Model, RolePlan, actor_plan, rollout_plan

FAMILIES = ("wan", "ltx2", "minimax-h3")
"""Families the plan knows (token rules and activation inputs)."""
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
NO_FIT = ("no layout up to ulysses 16 and no larger device of the table fits: lower the frames or size, the batch, "
          "or train with model.gradientCheckpointing")


@dataclass
class JobPlan:
    """Every model role's plan and, for a role that does not fit, layouts that would.

    Attributes:
        product: the device (`accelerator.product` or its type's default).
        roles: `RolePlan` per model role.
        fixes: role → lines naming fields and values that would fit (empty when it fits).
    """

    product: dict
    roles: list[RolePlan]
    fixes: dict


def product_of(spec, role: str, override: str | None = None) -> str:
    """The device a role's replicas run on: `override`, its `accelerator.product`, or the type's default."""
    acc = getattr(spec.roles, role).accelerator
    return override or acc.product or DEFAULT_PRODUCT.get(acc.type, "h100-80gb")


def read_model(spec, root: str | Path) -> Model:
    """The plan's view of the model under `root` for `spec` (components on meta, activations on meta).

    Raises:
        ValueError: a family the plan does not know, a video size its VAE cannot take, no `spec.model.video`.
        FileNotFoundError: no `transformer/config.json` under `root`.
    """
    family = spec.model.family
    if family not in FAMILIES:
        raise ValueError(f"spec.model.family: the memory plan knows {', '.join(FAMILIES)}, not {family}")
    if spec.model.video is None:
        raise ValueError("spec.model.video: the memory plan needs the job's frames, height and width")
    b = DTYPE_BYTES[spec.model.dtype]
    with _quiet():
        return _read_model(spec, root, family, b)


def _read_model(spec, root, family: str, b: int) -> Model:
    import torch

    from omnirl.planning.activations import bytes_per_token_layer
    from omnirl.planning.components import lora_params, read_components
    from omnirl.planning.tokens import sample_tokens

    parts = read_components(root, b)
    transformer = parts["transformer"]
    v = spec.model.video
    tokens = sample_tokens(family, {n: p.config for n, p in parts.items()}, v.frames, v.height, v.width, v.fps)
    act = bytes_per_token_layer(family, transformer.config, getattr(torch, spec.model.dtype))
    c = transformer.config
    if family == "ltx2":
        hidden = {"video": c.get("num_attention_heads", 32) * c.get("attention_head_dim", 128) * b,
                  "audio": c.get("audio_num_attention_heads", 32) * c.get("audio_attention_head_dim", 64) * b}
    elif family == "minimax-h3":
        hidden = {"video": c.get("hidden_size", 5376) * b}
    else:
        hidden = {"video": c.get("num_attention_heads", 40) * c.get("attention_head_dim", 128) * b}
    lora = spec.model.lora
    targets = list(lora.targetModules) or ["to_q", "to_k", "to_v", "to_out.0"]
    encoders = [p for n, p in parts.items() if n.startswith("text_encoder")]
    others = sum(p.bytes for n, p in parts.items() if n != "transformer" and not n.startswith("text_encoder"))
    return Model(family=family, transformer=transformer.bytes, encoders=sum(p.bytes - p.split_bytes for p in encoders),
                 encoders_split=sum(p.split_bytes for p in encoders), others=others,
                 largest_block=transformer.largest_block_bytes, layers=transformer.layers, hidden=hidden, act=act,
                 lora=lora_params(transformer, lora.rank, targets) * b if lora.enabled else 0.0, tokens=tokens)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """diffusers' and transformers' warnings off while models are built on meta (casting fp32-kept modules,
    weight norms): they speak of loading weights, which the plan never does."""
    import diffusers
    import transformers

    levels = diffusers.utils.logging.get_verbosity(), transformers.logging.get_verbosity()
    diffusers.utils.logging.set_verbosity_error()
    transformers.logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        diffusers.utils.logging.set_verbosity(levels[0])
        transformers.logging.set_verbosity(levels[1])


def _role_plans(spec, model: Model, products: dict) -> list[RolePlan]:
    from omnirl.actor.algorithm import algorithm_for

    algo = spec.algorithm
    needs = algorithm_for(algo.name).needs(algo)
    cfg = algo.sampling.guidanceScale > 1
    window = algo.flowGrpo.window.size if algo.name == "flow-grpo" else 0
    copies = int(needs.reference) + int(needs.old_policy is not None)
    return [rollout_plan(spec, model, GPU_MEMORY_GIB[products["rollout"]] * GIB, cfg=cfg, window=window),
            actor_plan(spec, model, GPU_MEMORY_GIB[products["actor"]] * GIB, cfg=cfg, copies=copies,
                       old_lora=needs.old_policy is not None)]


def _heads(model_root: Path) -> list[int]:
    import json

    c = json.loads((model_root / "transformer" / "config.json").read_text())
    return [v for k, v in c.items() if k.endswith("num_attention_heads") and isinstance(v, int)]


def _encoder_heads(model_root: Path) -> list[int]:
    import json

    from omnirl.models.parallel.layout import encoder_heads

    out = []
    for path in model_root.glob("text_encoder*/config.json"):
        out += list(encoder_heads(json.loads(path.read_text()))[1].values())
    return out


def _fixes(spec, model: Model, products: dict, root: Path, role: str) -> list[str]:
    """Layouts of `role` that fit, fewest devices first (at most 3 lines)."""
    heads, enc_heads = _heads(root), _encoder_heads(root)
    degrees = [d for d in (1, 2, 4, 8, 16) if all(h % d == 0 for h in heads)]
    enc = [d for d in (1, 2, 4, 8) if all(h % d == 0 for h in enc_heads)]
    found: list[tuple[int, str]] = []
    for u in degrees:
        for e in enc:
            if u % e:
                continue
            trial = copy.deepcopy(spec)
            layout = getattr(trial.roles, role).parallel
            layout.ulysses, layout.encoderTensor = u, e
            variants = [(trial, "")]
            if role == "actor" and not spec.model.gradientCheckpointing:
                ckpt = copy.deepcopy(trial)
                ckpt.model.gradientCheckpointing = True
                variants.append((ckpt, ", model.gradientCheckpointing: true"))
            if role == "rollout":
                for batch in (8, 4, 2, 1):
                    if batch < spec.roles.rollout.maxBatchSize:
                        smaller = copy.deepcopy(trial)
                        smaller.roles.rollout.maxBatchSize = batch
                        variants.append((smaller, f", maxBatchSize: {batch}"))
            for candidate, extra in variants:
                plans = _role_plans(candidate, model, products)
                plan = next(p for p in plans if p.role == role)
                if plan.fits:
                    found.append((u, f"spec.roles.{role}.parallel: ulysses: {u}, encoderTensor: {e}{extra} "
                                     f"({plan.allocated / GIB:.1f} GiB allocated)"))
                    break
    found.sort(key=lambda x: x[0])
    return [line for _, line in found[:3]]


def _larger_devices(spec, model: Model, products: dict, role: str) -> list[str]:
    """The larger devices of the table on which `role`'s layout as written fits (when no layout fits its own)."""
    own = GPU_MEMORY_GIB[products[role]]
    out = []
    for name, gib in sorted(GPU_MEMORY_GIB.items(), key=lambda kv: kv[1]):
        if gib <= own or (name == "ascend-910b") != (products[role] == "ascend-910b"):
            continue
        plan = next(p for p in _role_plans(spec, model, {**products, role: name}) if p.role == role)
        if plan.fits:
            out.append(f"accelerator.product: {name} ({plan.allocated / GIB:.1f} GiB allocated of {gib:g})")
    return out[:2]


def plan_job(job, root: str | Path | None = None, product: str | None = None) -> JobPlan:
    """The plan of `job` (its model's configs under `root`, default `spec.model.path`) on `product` (default: each
    role's `accelerator.product`, else its type's common device).

    Raises:
        as `read_model`.
    """
    spec = job.spec
    root = Path(root if root is not None else spec.model.path)
    model = read_model(spec, root)
    products = {role: product_of(spec, role, product) for role in ("rollout", "actor")}
    roles = _role_plans(spec, model, products)
    fixes = {p.role: _fixes(spec, model, products, root, p.role) or _larger_devices(spec, model, products, p.role)
             for p in roles if not p.fits}
    return JobPlan(products, roles, fixes)


def fit_problems(job, root: str | Path | None = None) -> list[str]:
    """`omnirl validate`'s lines for roles that do not fit their devices (none for a CPU role or a family the plan
    does not know)."""
    spec = job.spec
    if spec.model.family not in FAMILIES or spec.model.video is None:
        return []
    plan = plan_job(job, root)
    out = []
    for p in plan.roles:
        if getattr(spec.roles, p.role).accelerator.type == "cpu" or p.fits:
            continue
        fix = plan.fixes.get(p.role) or [NO_FIT]
        out.append(f"spec.roles.{p.role}.parallel: needs {(p.allocated / GIB) + 2:.1f} GiB per device, the "
                   f"{plan.product[p.role]} has {p.capacity / GIB:.1f} GiB (omnirl plan shows the table); fits: "
                   + "; ".join(fix))
    return out
