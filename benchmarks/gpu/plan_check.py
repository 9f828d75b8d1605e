"""`omnirl plan`'s prediction against the measured peak on one GPU (docs/parallel.md, "Memory plan": the ±15 % claim).

For each preset (a job, its model's shipped configs, one device): build every component the plan counts at its real
width with random weights in the job's dtype on the GPU (built on `meta`, cast, `to_empty`, filled), then

- rollout: the text encoders' forward (one prompt, its negative with CFG), one transformer forward of
  maxBatchSize samples (×2 with CFG) at the job's frames × size under `no_grad`, with the in-flight latents and the
  weight-sync bucket allocated as the rollout holds them;
- actor (after freeing the rollout's): LoRA adapters (or frozen reference/old copies for full fine-tuning), AdamW,
  gradient checkpointing as the job says, one forward and backward of microBatchSize samples (×2 with CFG) and one
  optimiser step, the weight-sync buckets allocated;

and print `torch.cuda.max_memory_allocated` of each phase next to the plan's "allocated" for that role, writing
JSON to $OUT (or `--out`). The VAE decode's peak is measured apart (`vae_decode_gib`): the plan does not count it.

`--steady-state` measures the actor as training runs after its first step, the peak the plan predicts: one
micro-batch and a step (AdamW makes its two moments), `zero_grad(set_to_none=True)`, then two micro-batches
accumulating gradients before the next step, so the second one's activations sit on the weights, the gradients
and both moments. Without it (the 2026-12-07 run) the actor's peak is a first step's: no moments and no gradients
under the activations, lower than the plan by its "gradients + AdamW moments" row (docs/parallel.md).

    python -m benchmarks.gpu.plan_check                      # the three presets, one H200
    python -m benchmarks.gpu.plan_check --preset ltx2-lora   # one of them
    python -m benchmarks.gpu.plan_check --steady-state       # the actor after its first step

Presets (single device: every degree 1; the plan's formula is the same at any degree, and its parallel terms are
divisions the CPU tests check):
- `ltx2-lora`: LTX-2.3 (19B + Gemma 3 12B), 81 × 256x384 + audio, LoRA r64, gradient checkpointing, CFG 4.
- `wan-full`: Wan2.1-T2V-1.3B (+ UMT5-XXL), 33 × 240x416 (flow_grpo's OCR recipe), all weights trained, no
  checkpointing, a KL reference copy, CFG 4.5.
- `h3-lora`: MiniMax-H3 (33B + Qwen3-VL-32B), 124 × 256x384 + audio, LoRA r64, gradient checkpointing: the largest
  that fits one H200 (the plan: ~130 GiB of 140).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
GIB = 2**30


def _single_device(doc: dict, product: str) -> dict:
    doc = copy.deepcopy(doc)
    roles = doc["spec"]["roles"]
    for role in ("rollout", "actor"):
        roles[role]["replicas"] = 1
        roles[role]["parallel"] = {}
        roles[role]["accelerator"] = {"type": "nvidia", "count": 1, "product": product}
    doc["spec"].pop("storage", None)
    return doc


def presets(product: str = "h200") -> dict[str, tuple[dict, Path]]:
    """Preset name → (manifest dict on one device, its model's config directory)."""
    import yaml

    ltx = _single_device(yaml.safe_load((ROOT / "examples" / "gpu-ltx2-flowgrpo.yaml").read_text()), product)
    h3 = _single_device(yaml.safe_load((ROOT / "examples" / "gpu-minimax-h3-nft.yaml").read_text()), product)
    wan = copy.deepcopy(ltx)
    wan["metadata"]["name"] = "wan-full"
    wan["spec"]["model"] = {"family": "wan", "path": "/models/wan", "dtype": "bfloat16", "gradientCheckpointing": False,
                            "video": {"frames": 33, "height": 240, "width": 416, "fps": 16}}
    wan["spec"]["algorithm"]["sampling"]["guidanceScale"] = 4.5
    wan["spec"]["algorithm"]["flowGrpo"]["klCoef"] = 0.004
    wan["spec"]["algorithm"]["optimizer"]["microBatchSize"] = 2
    wan["spec"]["roles"]["rollout"]["maxBatchSize"] = 8
    models = ROOT / "examples" / "models"
    return {"ltx2-lora": (ltx, models / "ltx-2.3"), "wan-full": (wan, models / "wan2.1-t2v-1.3b"),
            "h3-lora": (h3, models / "minimax-h3")}


def _materialize(config: dict, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """The component `config` names at its real width on `device`, random weights in `dtype` (fp32-kept modules
    float32), never holding a float32 copy of the whole (built on meta, cast there, then allocated)."""
    from omnirl.planning.components import build_on_meta

    module = build_on_meta(config)
    keep = tuple(getattr(module, "_keep_in_fp32_modules", None) or ())
    for name, sub in module.named_modules():
        params = list(sub.parameters(recurse=False))
        if params:
            kept = any(k in name.split(".") or k in name for k in keep)
            sub.to(torch.float32 if kept else dtype)
    module = module.to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.02, generator=g)
        for b in module.buffers():
            b.zero_() if b.is_floating_point() else None
    return module.eval()


def _peak(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else float("nan")


def _reset(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _encode(encoders: list, text: int, device: torch.device, rows: int) -> None:
    with torch.no_grad():
        for enc in encoders:
            ids = torch.zeros(rows, text, dtype=torch.long, device=device)
            enc(input_ids=ids, attention_mask=torch.ones_like(ids))


def _forward(family: str, model, config: dict, tokens, rows: int, dtype, device: torch.device):
    from omnirl.planning.activations import forward_inputs

    frames, gh, gw = tokens.grid
    audio = tokens.audio if family == "ltx2" else tokens.audio_rows
    inputs = forward_inputs(family, config, device, dtype, frames, audio, grid=(gh, gw), batch=rows,
                            text=tokens.text or 512)
    return model(**inputs)


def run_preset(name: str, doc: dict, configs: Path, device: torch.device, *, steady: bool = False) -> dict:
    """Plan and measure one preset; the JSON row (`steady`: the actor after its first step, module docstring)."""
    from peft import LoraConfig, inject_adapter_in_model

    from omnirl.api.loader import job_from_dict
    from omnirl.planning.components import read_components
    from omnirl.planning.memory import GATHER_BUCKET, SYNC_BUCKET
    from omnirl.planning.plan import DTYPE_BYTES, plan_job
    from omnirl.planning.tokens import sample_tokens

    job = job_from_dict(doc)
    spec = job.spec
    plan = plan_job(job, configs)
    predicted = {p.role: p.allocated / GIB for p in plan.roles}
    family, dtype = spec.model.family, getattr(torch, spec.model.dtype)
    parts = read_components(configs, DTYPE_BYTES[spec.model.dtype])
    v = spec.model.video
    tokens = sample_tokens(family, {n: p.config for n, p in parts.items()}, v.frames, v.height, v.width, v.fps)
    cfg = spec.algorithm.sampling.guidanceScale > 1
    lora = spec.model.lora
    targets = list(lora.targetModules) or ["to_q", "to_k", "to_v", "to_out.0"]
    measured, extra = {}, {}

    def build() -> tuple[dict, torch.nn.Module]:
        """A fresh set of the components on `device` after a reset of the peak counter; the transformer with
        its LoRA adapters when the job trains LoRA (each role measured from nothing held)."""
        _reset(device)
        modules = {n: _materialize(p.config, dtype, device) for n, p in parts.items()}
        transformer = modules["transformer"]
        if lora.enabled:
            inject_adapter_in_model(LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=targets),
                                    transformer)
            transformer.to(device)
        return modules, transformer

    # rollout
    modules, transformer = build()
    encoders = [m for n, m in modules.items() if n.startswith("text_encoder")]
    role = spec.roles.rollout
    window = spec.algorithm.flowGrpo.window.size if spec.algorithm.name == "flow-grpo" else 0
    held = [torch.empty(role.maxBatchSize * (window + 2) * tokens.latent_elements, device=device),
            torch.empty(SYNC_BUCKET, dtype=torch.uint8, device=device)]
    t0 = time.perf_counter()
    _encode(encoders, tokens.text or 512, device, 2 if cfg else 1)
    with torch.no_grad():
        _forward(family, transformer, parts["transformer"].config, tokens, role.maxBatchSize * (2 if cfg else 1),
                 dtype, device)
    measured["rollout"] = _peak(device)
    extra["rollout_seconds"] = time.perf_counter() - t0
    del held, modules, transformer, encoders
    # actor
    modules, transformer = build()
    if lora.enabled:
        transformer.requires_grad_(False)
        trainable = [p for n, p in transformer.named_parameters() if "lora_" in n]
        for p in trainable:
            p.requires_grad_(True)
        copies = []
    else:
        transformer.requires_grad_(True)
        trainable = list(transformer.parameters())
        from omnirl.actor.algorithm import algorithm_for

        needs = algorithm_for(spec.algorithm.name).needs(spec.algorithm)
        copies = [copy.deepcopy(transformer).requires_grad_(False)
                  for _ in range(int(needs.reference) + int(needs.old_policy is not None))]
    if spec.model.gradientCheckpointing:
        transformer.enable_gradient_checkpointing()
    transformer.train()
    optimizer = torch.optim.AdamW(trainable, lr=1e-6)
    held = [torch.empty(GATHER_BUCKET + SYNC_BUCKET, dtype=torch.uint8, device=device)]
    encoders = [m for n, m in modules.items() if n.startswith("text_encoder")]
    t0 = time.perf_counter()

    def micro_batch() -> None:
        _encode(encoders, tokens.text or 512, device, spec.algorithm.optimizer.microBatchSize)
        out = _forward(family, transformer, parts["transformer"].config, tokens,
                       spec.algorithm.optimizer.microBatchSize * (2 if cfg else 1), dtype, device)
        loss = sum(o.float().pow(2).mean() for o in (out if isinstance(out, (tuple, list)) else [out])
                   if isinstance(o, torch.Tensor))
        loss.backward()

    micro_batch()
    optimizer.step()
    if steady:  # the next minibatch: gradients freed, then two micro-batches accumulate them under AdamW's moments
        optimizer.zero_grad(set_to_none=True)
        micro_batch()
        micro_batch()
        optimizer.step()
    measured["actor"] = _peak(device)
    extra["actor_phase"] = "steady state (2nd step, 2 micro-batches)" if steady else "first step, 1 micro-batch"
    extra["actor_seconds"] = time.perf_counter() - t0
    del held, copies, optimizer
    # the VAE decode of one sample (not in the plan)
    vae = modules.get("vae")
    modules = transformer = encoders = None  # freed (the micro-batch closure holds these names)
    if vae is not None and device.type == "cuda":
        _reset(device)
        base = torch.cuda.memory_allocated(device)
        try:
            with torch.no_grad():
                frames, gh, gw = tokens.grid
                z = torch.randn(1, vae.config.latent_channels, frames, v.height // 8 if family == "wan" else gh,
                                v.width // 8 if family == "wan" else gw, device=device, dtype=dtype)
                vae.decode(z)
            extra["vae_decode_gib"] = (torch.cuda.max_memory_allocated(device) - base) / GIB
        except Exception as err:  # a VAE whose decode takes other inputs: said, not measured
            extra["vae_decode_gib"] = f"not measured: {type(err).__name__}: {err}"[:200]
    del vae
    _reset(device)
    return {"preset": name, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "predicted_gib": predicted, "measured_gib": measured,
            "ratio": {r: measured[r] / predicted[r] for r in measured if predicted[r]}, **extra}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", action="append", help="preset name (repeatable; default: all)")
    parser.add_argument("--product", default="h200", help="the device the plan fits into")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--steady-state", action="store_true",
                        help="measure the actor after its first step (AdamW's moments and gradients held)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    table = presets(args.product)
    rows = []
    for name in args.preset or list(table):
        doc, configs = table[name]
        row = run_preset(name, doc, configs, device, steady=args.steady_state)
        rows.append(row)
        for role in ("rollout", "actor"):
            print(f"{name:10} {role:8} predicted {row['predicted_gib'][role]:7.2f} GiB  measured "
                  f"{row['measured_gib'][role]:7.2f} GiB  ratio {row['ratio'].get(role, float('nan')):.3f}",
                  flush=True)
    out = Path(args.out) / "plan-check.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
