"""Rollout on the GPU: step-wise continuous batching vs static batching with the SAME compiled
kernels (so the ratio measures the scheduler), on a uniform and a mixed workload, plus one line
for the eager diffusers loop (`StableDiffusion3Pipeline`, what a diffusers-based FlowGRPO runs).

Workloads (groups of 8 samples of one prompt, FlowGRPO requests: a 3-step SDE window in the
first 6 steps, CPS noise 0.8):
- uniform: 512², 10 steps;
- mixed: 512² or 768² and 10 or 20 steps per group (training requests next to validation-length
  ones and a second resolution), shuffled.
- fragmented: groups of 4, each at one of 6 sizes (512², 640², 768², 768×512, 512×768,
  576×1024; several aspect ratios, few requests each; the first 6 groups cover every size, later
  ones pick at random), 10 steps — the case for packing
  (`batching="packed"`: mixed shapes in one forward) over shape buckets.
- sparse: groups of 1 or 2 over 8 sizes (SPARSE_SIZES: the 6 above, 1024×576 and 896×640) —
  validation prompts next to training, one or two samples per prompt and resolution: the
  per-shape batches a shape-bucketing engine can form stay at 1–4 samples.
- small: groups of 4 or 8 over 6 sizes below 512² (SMALL_SIZES: 256², 320², 384², 384×256,
  256×384, 256×512; 256–576 image tokens) — low-resolution, multi-aspect sampling, where a
  per-shape batch leaves the GPU's GEMMs small.
Arrival: `burst` (the whole batch queued at once, as the sync controller sends a step) and
`stream` (one group joins before every engine step, as fully-async refills arrive).
"""

from __future__ import annotations

import random

import torch

from benchmarks.gpu.common import compiled_graphs, mfu, request_flops, sync, timed
from omnirl.rollout.engine import RolloutEngine
from omnirl.rollout.types import SampleRequest

GROUP = 8


def requests(adapter, n: int, mixed: bool, seed: int = 0) -> list[SampleRequest]:
    """`n` requests in groups of 8 (see the module docstring)."""
    rng = random.Random(seed)
    out: list[SampleRequest] = []
    for g in range(n // GROUP):
        side = rng.choice([512, 768]) if mixed else 512
        steps = rng.choice([10, 20]) if mixed else 10
        start = rng.randrange(0, 4)
        ids = tuple(adapter.tokenize(f"prompt {seed}-{g} @{side}"))
        out += [SampleRequest(f"{g}:{i}", f"prompt {g}", ids, seed=seed * 100_000 + g * GROUP + i, num_steps=steps,
                              window=tuple(range(start, start + 3)), noise_level=0.8, sde_type="cps", shift=3.0)
                for i in range(GROUP)]
    return out


FRAGMENTED_SIZES = [(512, 512), (640, 640), (768, 768), (768, 512), (512, 768), (576, 1024)]
FRAGMENTED_GROUP = 4
SPARSE_SIZES = [*FRAGMENTED_SIZES, (1024, 576), (896, 640)]
SMALL_SIZES = [(256, 256), (320, 320), (384, 384), (384, 256), (256, 384), (256, 512)]


def fragmented_requests(adapter, n: int, seed: int = 0, sizes: list[tuple[int, int]] | None = None,
                        group: int = FRAGMENTED_GROUP) -> list[SampleRequest]:
    """`n` requests in groups of `group` (default 4), each group at one of `sizes` (default
    FRAGMENTED_SIZES; the first groups cover every size, later ones pick at random)."""
    rng = random.Random(seed)
    sizes = sizes or FRAGMENTED_SIZES
    out: list[SampleRequest] = []
    for g in range(n // group):
        h, w = sizes[g % len(sizes)] if g < len(sizes) else rng.choice(sizes)  # every size at least once
        start = rng.randrange(0, 4)
        ids = tuple(adapter.tokenize(f"prompt {seed}-{g} @{h}x{w}"))
        out += [SampleRequest(f"{g}:{i}", f"prompt {g}", ids, seed=seed * 100_000 + g * group + i,
                              num_steps=10, window=tuple(range(start, start + 3)), noise_level=0.8, sde_type="cps",
                              shift=3.0) for i in range(group)]
    return out


def run_engine(adapter, reqs: list[SampleRequest], batching: str, max_batch: int, arrival: str,
               device: torch.device, peak_tflops: float, config: dict, group: int = GROUP) -> dict:
    """Denoise every request (`stream`: `group` join before every engine step); images/s, forwards,
    mean batch, MFU and graphs compiled meanwhile."""
    engine = RolloutEngine(adapter, max_batch_size=max_batch, batching=batching, device=device)
    pending = list(reqs)
    per_step = len(pending) if arrival == "burst" else group
    graphs = compiled_graphs()

    def go() -> int:
        nonlocal pending
        done = 0
        while pending or engine.has_work():
            for r in pending[:per_step]:
                engine.submit(r)
            pending = pending[per_step:]
            done += len(engine.step())
        return done

    done, seconds = timed(go, device)
    flops = sum(request_flops(config, adapter.latent_shape(list(r.prompt_ids)), r.num_steps) for r in reqs)
    return {"batching": batching, "arrival": arrival, "images": done, "seconds": seconds,
            "images_per_second": done / seconds, "forwards": engine.stats.forwards,
            "mean_batch": engine.stats.mean_batch, "mfu": mfu(flops, seconds, peak_tflops),
            "recompiles": compiled_graphs() - graphs}


def warm_up(adapter, max_batch: int, device: torch.device) -> dict:
    """Compile every graph the measured runs need (batch 1, 2 and max, 512² and 768²); seconds and graphs."""
    graphs = compiled_graphs()

    def go() -> None:
        for side in (512, 768):
            for n in (1, 2, max_batch):
                ids = tuple(adapter.tokenize(f"warm @{side}"))
                engine = RolloutEngine(adapter, max_batch_size=n, batching="static", device=device)
                for i in range(n):
                    engine.submit(SampleRequest(f"w{i}", "warm", ids, seed=i, num_steps=3, window=(0,),
                                                noise_level=0.8, sde_type="cps", shift=3.0))
                engine.run_until_idle()

    _, seconds = timed(go, device)
    return {"seconds": seconds, "graphs": compiled_graphs() - graphs}


def eager_diffusers(module, n_images: int, batch: int, steps: int, device: torch.device, peak_tflops: float,
                    config: dict, text_tokens: int) -> dict:
    """images/s of diffusers' own SD3 loop (eager, static batch, 512², latents out, no VAE)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    from benchmarks.gpu.model import SD35_SCHEDULER

    scheduler = FlowMatchEulerDiscreteScheduler(**{k: v for k, v in SD35_SCHEDULER.items() if not k.startswith("_")})
    pipe = StableDiffusion3Pipeline(transformer=module, scheduler=scheduler, vae=None, text_encoder=None,
                                    tokenizer=None, text_encoder_2=None, tokenizer_2=None, text_encoder_3=None,
                                    tokenizer_3=None)
    pipe.set_progress_bar_config(disable=True)
    dtype = next(module.parameters()).dtype
    embeds = torch.randn(batch, text_tokens, config["joint_attention_dim"], device=device, dtype=dtype)
    pooled = torch.randn(batch, config["pooled_projection_dim"], device=device, dtype=dtype)

    def one() -> None:
        pipe(prompt_embeds=embeds, pooled_prompt_embeds=pooled, guidance_scale=1.0, num_inference_steps=steps,
             height=512, width=512, output_type="latent")

    one()  # warm-up (cuBLAS heuristics, allocator)
    sync(device)
    _, seconds = timed(lambda: [one() for _ in range(n_images // batch)], device)
    images = (n_images // batch) * batch
    flops = images * request_flops(config, (16, 64, 64), steps)
    return {"batching": "diffusers-eager", "arrival": "burst", "images": images, "seconds": seconds,
            "images_per_second": images / seconds, "mfu": mfu(flops, seconds, peak_tflops), "batch": batch}
