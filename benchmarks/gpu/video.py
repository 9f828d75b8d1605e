"""Video on one GPU: a Wan2.1-1.3B-sized transformer at flow_grpo's video recipe, and LTX-2 blocks at real width.

    python3 -m benchmarks.gpu.video --out benchmarks/results --budget-s 420 [--smoke] [--parts ...]

Model: diffusers' `WanTransformer3DModel` with Wan2.1-T2V-1.3B's configuration (30 layers, 12 heads × 128 = 1536,
ffn 8960, text dim 4096, patch (1, 2, 2), 16 in/out channels; 1.42 B parameters), random bf16 weights. The text
encoder (UMT5, 1 layer of width 4096: the 4096-wide embeddings Wan's transformer takes, 512 tokens) and the VAE
(`AutoencoderKLWan`, base width 3, Wan 2.1's factors 4 and 8, 16 latent channels) are tiny random ones: nothing can be
downloaded on the GPU machine, and the benchmark times the denoiser. The whole pipeline is saved as a diffusers Wan
directory and loaded through the product's `wan` family (`WanAdapter.load`), in-process and by `omnirl run` alike.

Recipe (flow_grpo's Wan 2.1 config): 33 frames × 240×416 (latent 9 × 30 × 52: 3,510 video tokens), 20 denoising
steps, CFG 4.5 (2 rows per sample per forward), LoRA r32 on the family's default targets (to_q, to_k, to_v, to_out.0
of self- and cross-attention), FlowGRPO with a 3-step CPS window (noise 0.8) in the first 6 steps, `bypass`, one group
of `--group` samples of one prompt per RL step, reward = temporal consistency of the decoded video (CPU).

Parts, in order, each skipped (and recorded under `skipped`) when the budget left is below its estimate:
- `rollout`: the step-wise engine denoising one group, eager (`video_rollout_eager`) then with the engine's optimised
  path (blocks compiled as `model.compile` does, attention as `spec.model.attention: auto` resolves it); FLOPs counted
  analytically (`benchmarks.gpu.flops.wan_forward_flops`) → `video_rollout_mfu` (measured bf16 matmul peak, as the
  image suite) and `video_speedup_vs_eager` (eager seconds ÷ optimised seconds, same requests).
- `ltx2`: `LTX2VideoTransformer3DModel` at LTX-2's real widths (diffusers' defaults: video 32 × 128, audio 32 × 64,
  caption 3840) with 1 and 3 blocks instead of 48, at 121 frames × 512×768 (6,144 video tokens) with 126 audio latents
  and 1,024 text tokens, 2 rows (CFG); per block = (3-block − 1-block) ÷ 2 → `ltx2_block_ms_forward`,
  `ltx2_block_ms_backward` (full-parameter backward, eager).
- `inprocess`: one RL step in one process, as `benchmarks.gpu.e2e`'s omnirl configuration: rollout copy and actor copy
  on the GPU, rollout of the group with each sample scored on a CPU thread as it finishes, one FlowGRPO update
  (micro-batch 1 sample, KL 0.01), LoRA tensors copied into the rollout copy. Step 1 compiles; the mean of the later
  steps is `video_step_seconds_inprocess`.
- `service`: `omnirl run --share-gpus` of the same job (role processes, redis-server, CUDA-IPC weight sync), phases
  from its metrics.jsonl (`benchmarks.gpu.service.run_service`); the mean of the steps after the first is
  `video_step_seconds_service`.

Output: key `video` of `<out>/<date>-<device>.json` (the image suite's file; `--smoke`: `<date>-cpu-tiny.json`) with
the raw numbers, `skipped` (part → why) and `headline` (the keys above, null when skipped); the headline keys are also
merged into the file's top-level `headline` (not with `--smoke`). `--smoke` runs every part at tiny sizes on the CPU
(numbers meaningless; the CPU test's path).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import shutil
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import torch

from benchmarks.gpu.common import matmul_peak_tflops, merge_results, mfu, results_path, sync, timed
from benchmarks.gpu.flops import wan_forward_flops

ROOT = Path(__file__).resolve().parents[2]

WAN21_T2V_1_3B = {
    "patch_size": [1, 2, 2], "num_attention_heads": 12, "attention_head_dim": 128, "in_channels": 16,
    "out_channels": 16, "text_dim": 4096, "freq_dim": 256, "ffn_dim": 8960, "num_layers": 30, "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads", "eps": 1e-6, "rope_max_seq_len": 1024,
}
"""Wan-AI/Wan2.1-T2V-1.3B-Diffusers transformer/config.json (1.42 B parameters)."""

WAN_TINY = {**WAN21_T2V_1_3B, "num_attention_heads": 2, "attention_head_dim": 12, "text_dim": 32, "ffn_dim": 32,
            "num_layers": 2, "rope_max_seq_len": 32}
"""A CPU-sized variant of the same block structure (`--smoke`)."""

RECIPE = {"frames": 33, "height": 240, "width": 416, "fps": 16.0, "steps": 20, "cfg": 4.5, "text_tokens": 512}
"""flow_grpo's Wan 2.1 video recipe."""

SMOKE_RECIPE = {"frames": 5, "height": 32, "width": 32, "fps": 8.0, "steps": 3, "cfg": 4.5, "text_tokens": 16}

LTX2_LAYERS = (1, 3)
"""Block counts of the two LTX-2 models; their difference isolates the blocks from the embeddings and output."""

LTX2_GEOMETRY = {"frames": 121, "height": 512, "width": 768, "fps": 24.0, "text_tokens": 1024}
"""LTX2Pipeline's default clip (121 frames of 512×768 at 24 fps); Gemma 3's 1,024 prompt tokens."""

LTX2_TINY = {"num_attention_heads": 2, "attention_head_dim": 8, "cross_attention_dim": 16, "in_channels": 4,
             "out_channels": 4, "audio_in_channels": 4, "audio_out_channels": 4, "audio_num_attention_heads": 2,
             "audio_attention_head_dim": 4, "audio_cross_attention_dim": 8, "caption_channels": 32,
             "rope_double_precision": False}
LTX2_SMOKE_GEOMETRY = {"frames": 9, "height": 64, "width": 64, "fps": 24.0, "text_tokens": 8}

ESTIMATE_S = {"rollout": 100.0, "ltx2": 30.0, "inprocess": 120.0, "service": 150.0}
"""Least seconds each part needs on an H100 (compilation included), judged from the image suite's timings: a part
starts only with this much budget left (`--smoke`: 1 s each)."""

PROMPT = "a red fox runs through fresh snow at dawn"
HEADLINE = ("video_rollout_mfu", "video_speedup_vs_eager", "video_step_seconds_inprocess", "video_step_seconds_service",
            "ltx2_block_ms_forward", "ltx2_block_ms_backward")


# ----------------------------------------------------------------------------------------------- the model directory
def build_wan_dir(path: Path, config: dict, text_tokens: int, device: str) -> Path:
    """Save a diffusers Wan directory (`WanPipeline.save_pretrained`): the transformer of `config` (random, bf16) with
    a tiny random UMT5 of width `config["text_dim"]` (a character tokenizer, `text_tokens` tokens) and a tiny
    `AutoencoderKLWan` (z_dim 16, factors 4 and 8), UniPC flow scheduler with shift 3 (Wan 2.1's). Kept if present."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import T5TokenizerFast, UMT5Config, UMT5EncoderModel

    if (path / "model_index.json").exists():
        return path
    torch.manual_seed(0)
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    vocab += [(c, -3.0) for c in "abcdefghijklmnopqrstuvwxyz0123456789"]
    text_encoder = UMT5EncoderModel(UMT5Config(
        vocab_size=len(vocab), d_model=int(config["text_dim"]), d_kv=8, d_ff=37, num_layers=1, num_heads=4,
        relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)).eval()
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    with torch.device(device):
        transformer = WanTransformer3DModel(**config).to(torch.bfloat16)
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0,
                                        num_train_timesteps=1000)
    tokenizer = T5TokenizerFast(vocab=vocab, extra_ids=0, model_max_length=text_tokens)
    WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=scheduler,
                transformer=transformer).save_pretrained(path)
    del transformer
    return path


def load_adapter(model_dir: Path, recipe: dict, device: torch.device, dtype: torch.dtype):
    """The product's `WanAdapter.load` of `model_dir` at the recipe's clip and CFG."""
    from omnirl.models.diffusers.video import VideoGeometry
    from omnirl.models.diffusers.wan import WanAdapter

    video = VideoGeometry(recipe["frames"], recipe["height"], recipe["width"], recipe["fps"])
    return WanAdapter.load(model_dir, device=device, dtype=dtype, video=video, guidance_scale=recipe["cfg"])


def select_backend(adapter, family: str, device: torch.device, dtype: torch.dtype) -> str:
    """`spec.model.attention: auto` as the roles apply it (`omnirl.models.attention.select_attention`)."""
    from omnirl.models.attention import resolve, use_backend

    chosen = resolve("auto", family, adapter.module, device, dtype)
    if chosen != "torch":
        use_backend(adapter.module, adapter.compile_block_types, chosen)
    return chosen


def window_size(steps: int) -> int:
    """FlowGRPO window: 3 steps (of the first 6), fewer when `steps` is too small (the smoke run's 3)."""
    return max(1, min(3, steps - 2))


def group_requests(adapter, step: int, group: int, steps: int) -> list:
    """One RL step's requests: `group` samples of one prompt, a 3-step CPS window in the first 6 steps."""
    from omnirl.rollout.types import SampleRequest

    size = window_size(steps)
    start = random.Random(step).randrange(0, min(4, steps - 1 - size + 1))  # the last step is never stochastic
    window = tuple(range(start, start + size))
    ids = tuple(adapter.tokenize(f"{PROMPT} {step}"))
    return [SampleRequest(f"{step}:0:{i}", f"{PROMPT} {step}", ids, seed=step * 1000 + i, num_steps=steps,
                          window=window, noise_level=0.8, sde_type="cps") for i in range(group)]


def rollout_flops(config: dict, recipe: dict, adapter, samples: int) -> float:
    """Denoiser FLOPs of `samples` samples: steps × CFG rows × one row's forward (`wan_forward_flops`)."""
    _, t, h, w = adapter.slots()[0][1]
    rows = 2 if recipe["cfg"] > 1 else 1
    return samples * recipe["steps"] * rows * wan_forward_flops(config, (t, h, w), recipe["text_tokens"])


# ----------------------------------------------------------------------------------------------- parts
def run_rollout(adapter, requests: list, device: torch.device, max_batch: int) -> tuple[list, float]:
    """Denoise `requests` through the step-wise engine (all queued at once); (results, seconds)."""
    from omnirl.rollout.engine import RolloutEngine

    engine = RolloutEngine(adapter, max_batch_size=max_batch, batching="stepwise", device=device)
    for r in requests:
        engine.submit(r)
    return timed(engine.run_until_idle, device)


def rollout_part(ctx: dict) -> dict:
    """Eager engine, then compile warm-up, then the optimised engine, on the same group; MFU and the speed-up."""
    from omnirl.api.spec import LoRASpec
    from omnirl.models.compile import compile_adapter_module
    from omnirl.models.lora import prepare_rollout_module

    device, recipe, group = ctx["device"], ctx["recipe"], ctx["group"]
    adapter = load_adapter(ctx["model_dir"], recipe, device, ctx["dtype"])
    prepare_rollout_module(adapter, LoRASpec(enabled=True, rank=32, alpha=64))  # as a rollout worker holds it
    reqs = group_requests(adapter, 0, group, recipe["steps"])
    flops = rollout_flops(ctx["config"], recipe, adapter, group)
    run_rollout(adapter, reqs[:1], device, ctx["max_batch"])  # cuBLAS heuristics, allocator, the text encoder
    _, eager_s = run_rollout(adapter, reqs, device, ctx["max_batch"])
    out = {"samples": group, "flops": flops, "flops_per_row_forward": flops / group / recipe["steps"] /
           (2 if recipe["cfg"] > 1 else 1), "eager": {"seconds": eager_s, "mfu": mfu(flops, eager_s, ctx["peak"]),
                                                         "attention": "torch"}}
    out["attention"] = select_backend(adapter, "wan", device, ctx["dtype"])
    if ctx["compile"]:
        compile_adapter_module(adapter)
    _, warm = run_rollout(adapter, reqs, device, ctx["max_batch"])
    _, seconds = run_rollout(adapter, reqs, device, ctx["max_batch"])
    out["optimised"] = {"seconds": seconds, "warmup_seconds": warm, "compiled": ctx["compile"],
                        "mfu": mfu(flops, seconds, ctx["peak"]), "samples_per_second": group / seconds}
    out["video_rollout_mfu"] = out["optimised"]["mfu"]
    out["video_speedup_vs_eager"] = eager_s / seconds
    print(f"  rollout of {group}: eager {eager_s:.2f} s, optimised {seconds:.2f} s (warm-up {warm:.1f} s), "
          f"MFU {out['video_rollout_mfu']:.1%}, speed-up {out['video_speedup_vs_eager']:.2f}x", flush=True)
    del adapter
    return out


def ltx2_inputs(module, rows: int, geometry: dict, device: torch.device, dtype: torch.dtype) -> dict:
    """Random inputs of the LTX-2 transformer's real shapes for `rows` rows, as `LTX2Adapter.velocity` passes them."""
    cfg = module.config
    t = (geometry["frames"] - 1) // int(cfg.vae_scale_factors[0]) + 1
    h, w = geometry["height"] // int(cfg.vae_scale_factors[1]), geometry["width"] // int(cfg.vae_scale_factors[2])
    audio_frames = round(geometry["frames"] / geometry["fps"] * cfg.audio_sampling_rate / cfg.audio_hop_length
                         / cfg.audio_scale_factor)
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device, dtype)

    text = geometry["text_tokens"]
    timestep = torch.full((rows,), 500.0, device=device)
    return {"hidden_states": rand(rows, t * h * w, cfg.in_channels),
            "audio_hidden_states": rand(rows, audio_frames, cfg.audio_in_channels),
            "encoder_hidden_states": rand(rows, text, cfg.caption_channels),
            "audio_encoder_hidden_states": rand(rows, text, cfg.caption_channels),
            "timestep": timestep, "sigma": timestep,
            "encoder_attention_mask": torch.ones(rows, text, device=device, dtype=torch.long),
            "audio_encoder_attention_mask": torch.ones(rows, text, device=device, dtype=torch.long),
            "num_frames": t, "height": h, "width": w, "fps": geometry["fps"], "audio_num_frames": audio_frames,
            "video_coords": module.rope.prepare_video_coords(rows, t, h, w, device, fps=geometry["fps"]),
            "audio_coords": module.audio_rope.prepare_audio_coords(rows, audio_frames, device),
            "use_cross_timestep": True, "return_dict": False}


def ltx2_timing(ctx: dict, layers: int, geometry: dict, rows: int, repeats: int) -> dict:
    """Seconds of one forward (no grad) and one forward + full-parameter backward of LTX-2 with `layers` blocks."""
    from diffusers import LTX2VideoTransformer3DModel

    from omnirl.models.attention import resolve, use_backend

    device, dtype = ctx["device"], ctx["dtype"]
    torch.manual_seed(0)
    with torch.device(device):
        module = LTX2VideoTransformer3DModel(**(LTX2_TINY if ctx["smoke"] else {}), num_layers=layers).to(dtype)
    backend = resolve("auto", "ltx2", module, device, dtype)
    if backend != "torch":
        use_backend(module, ["LTX2VideoTransformerBlock"], backend)
    inputs = ltx2_inputs(module, rows, geometry, device, dtype)

    def forward():
        with torch.no_grad():
            return module(**inputs)

    def forward_backward():
        video, audio = module(**inputs)
        (video.float().square().mean() + audio.float().square().mean()).backward()
        module.zero_grad(set_to_none=True)

    forward(), forward_backward()  # warm-up (cuBLAS heuristics, allocator)
    _, f = timed(lambda: [forward() for _ in range(repeats)], device)
    _, fb = timed(lambda: [forward_backward() for _ in range(repeats)], device)
    return {"forward": f / repeats, "forward_backward": fb / repeats, "attention": backend,
            "parameters": sum(p.numel() for p in module.parameters()),
            "video_tokens": inputs["hidden_states"].shape[1], "audio_tokens": inputs["audio_num_frames"]}


def ltx2_part(ctx: dict) -> dict:
    """LTX-2 with 1 and 3 blocks (`ltx2_timing`); per block = the difference ÷ 2, backward = (fwd+bwd) − fwd."""
    geometry = LTX2_SMOKE_GEOMETRY if ctx["smoke"] else LTX2_GEOMETRY
    rows, repeats = 2, 1 if ctx["smoke"] else 3
    runs = {}
    for layers in LTX2_LAYERS:
        runs[layers] = ltx2_timing(ctx, layers, geometry, rows, repeats)
        gc.collect()
        if ctx["device"].type == "cuda":
            torch.cuda.empty_cache()
    one, more = runs[LTX2_LAYERS[0]], runs[LTX2_LAYERS[1]]
    blocks = LTX2_LAYERS[1] - LTX2_LAYERS[0]
    out = {"geometry": geometry, "rows": rows, "repeats": repeats, "attention": one["attention"],
           "video_tokens": one["video_tokens"], "audio_tokens": one["audio_tokens"],
           "runs": {f"{k}_blocks": v for k, v in runs.items()},
           "ltx2_block_ms_forward": (more["forward"] - one["forward"]) / blocks * 1e3,
           "ltx2_block_ms_backward": ((more["forward_backward"] - more["forward"])
                                      - (one["forward_backward"] - one["forward"])) / blocks * 1e3}
    print(f"  LTX-2 block: forward {out['ltx2_block_ms_forward']:.1f} ms, backward {out['ltx2_block_ms_backward']:.1f} "
          f"ms ({rows} rows, {out['video_tokens']} video + {out['audio_tokens']} audio tokens)", flush=True)
    return out


def inprocess_part(ctx: dict) -> dict:
    """`--steps` RL steps in one process (module docstring); the first is warm-up."""
    from benchmarks.gpu.actor import grpo_spec, train_samples
    from benchmarks.gpu.e2e import _weight_sync
    from omnirl.actor.flow_grpo_update import flow_grpo_step
    from omnirl.actor.policy import PolicySet
    from omnirl.api.spec import LoRASpec
    from omnirl.api.spec_algorithm import OptimizerSpec
    from omnirl.models.compile import compile_adapter_module
    from omnirl.models.lora import lora_tensors, prepare_rollout_module
    from omnirl.reward.temporal import TemporalConsistencyScorer
    from omnirl.rollout.engine import RolloutEngine

    device, recipe, group, dtype = ctx["device"], ctx["recipe"], ctx["group"], ctx["dtype"]
    rollout, actor = (load_adapter(ctx["model_dir"], recipe, device, dtype) for _ in range(2))
    lora = LoRASpec(enabled=True, rank=32, alpha=64)
    attention = select_backend(rollout, "wan", device, dtype)
    select_backend(actor, "wan", device, dtype)
    policies = PolicySet(actor, lora, need_ref=True, need_old=False)
    prepare_rollout_module(rollout, lora)
    if ctx["compile"]:
        policies.compile()
        compile_adapter_module(rollout)
    optimizer = torch.optim.AdamW(policies.trainable_parameters(), lr=1e-5)
    spec, opt = grpo_spec("bypass"), OptimizerSpec(microBatchSize=1, updatesPerStep=1)
    engine = RolloutEngine(rollout, max_batch_size=ctx["max_batch"], batching="stepwise", device=device)
    scorer, pool = TemporalConsistencyScorer(), ThreadPoolExecutor(max_workers=4)
    target = lora_tensors(rollout.module)
    rows = []
    for step in range(ctx["steps"]):
        for r in group_requests(rollout, step, group, recipe["steps"]):
            engine.submit(r)

        def rollout_and_reward():
            results, futures = [], []
            while engine.has_work():
                done = engine.step()
                results += done
                futures += [pool.submit(scorer.score_media, [r.media], [r.request.prompt], [r.request.sample_id])
                            for r in done]
            return results, [float(f.result()[0]) for f in futures]

        (results, rewards), t_rollout = timed(rollout_and_reward, device)
        samples = train_samples(results, rewards)
        metrics, t_train = timed(partial(flow_grpo_step, policies, optimizer, samples, spec, opt, seed=0, step=step,
                                         device=device), device)
        _, t_sync = timed(partial(_weight_sync, policies, target, engine, step + 1), device)
        rows.append({"step": step, "seconds": t_rollout + t_train + t_sync, "rollout_reward_seconds": t_rollout,
                     "train_seconds": t_train, "sync_seconds": t_sync, "samples": len(results),
                     "loss": float(metrics["loss"]), "reward_mean": sum(rewards) / len(rewards)})
        print(f"  in-process step {step}: {rows[-1]['seconds']:.2f} s (rollout+reward {t_rollout:.2f}, train "
              f"{t_train:.2f}, sync {t_sync:.2f})", flush=True)
        if ctx["left"]() < rows[-1]["seconds"] * 1.2 and step + 1 < ctx["steps"]:
            print("  in-process: no budget for another step", flush=True)
            break
    pool.shutdown()
    timed_rows = rows[1:] or rows
    out = {"steps": rows, "samples": group, "micro_batch": 1, "attention": attention, "compiled": ctx["compile"],
           "warmup_step_seconds": rows[0]["seconds"], "timed_steps": len(rows[1:]),
           **{k: sum(r[k] for r in timed_rows) / len(timed_rows)
              for k in ("seconds", "rollout_reward_seconds", "train_seconds", "sync_seconds")}}
    out["video_step_seconds_inprocess"] = out["seconds"] if rows[1:] else None
    return out


def service_manifest(work: Path, model_dir: Path, ctx: dict) -> Path:
    """The same job as an RLJob (`omnirl run`): wan family, the recipe's clip, LoRA r32, FlowGRPO bypass."""
    import yaml

    recipe, device = ctx["recipe"], ctx["device"]
    acc = {"type": "nvidia", "count": 1} if device.type == "cuda" else {"type": "cpu"}
    video = {k: recipe[k] for k in ("frames", "height", "width", "fps")}
    doc = {"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "video-bench"}, "spec": {
        "model": {"family": "wan", "path": str(model_dir), "dtype": "bfloat16" if device.type == "cuda" else "float32",
                  "video": video, "compile": ctx["compile"], "lora": {"enabled": True, "rank": 32, "alpha": 64}},
        "data": {"trainPrompts": str(ROOT / "examples/prompts/ocr-train.txt"),
                 "validationPrompts": str(ROOT / "examples/prompts/ocr-heldout.txt")},
        "algorithm": {"name": "flow-grpo", "steps": ctx["steps"], "groupSize": ctx["group"], "promptsPerStep": 1,
                      "sampling": {"numSteps": recipe["steps"], "guidanceScale": recipe["cfg"]},
                      "optimizer": {"learningRate": 1e-5, "microBatchSize": 1, "updatesPerStep": 1},
                      "flowGrpo": {"sdeType": "cps", "noiseLevel": 0.8,
                                   "window": {"size": window_size(recipe["steps"]),
                                              "range": [0, min(6, recipe["steps"] - 1)]},
                                   "clipRange": 1e-3, "klCoef": 0.01, "rolloutCorrection": {"mode": "bypass"}}},
        "reward": [{"name": "smooth", "kind": "temporal-consistency"}],
        "pipeline": {"mode": "async-reward", "maxStaleness": 1},
        "validation": {"everySteps": 0, "numSteps": 2, "maxPrompts": 1},
        "checkpoint": {"everySteps": 0, "keep": 1},
        "roles": {"rollout": {"accelerator": acc, "batching": "stepwise", "maxBatchSize": ctx["max_batch"]},
                  "actor": {"accelerator": acc}}}}
    path = work / "video-bench.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def service_part(ctx: dict) -> dict:
    """`omnirl run` of `service_manifest` (one GPU shared by rollout and actor); per-step phases."""
    import subprocess

    from benchmarks.gpu.service import run_service

    gc.collect()
    if ctx["device"].type == "cuda":
        torch.cuda.empty_cache()
    job = service_manifest(ctx["work"], ctx["model_dir"], ctx)
    out_dir = ctx["work"] / f"run-service-{int(time.time())}"
    timeout = max(10, int(ctx["left"]() - 5))
    try:
        res = run_service(job, out_dir, share=ctx["device"].type == "cuda", device=ctx["device"].type,
                          timeout_s=timeout)
    except subprocess.TimeoutExpired:
        steps = []
        metrics = out_dir / "metrics.jsonl"
        if metrics.exists():
            steps = [r for r in map(json.loads, metrics.read_text().splitlines()) if r.get("event") == "step"]
        return {"timed_out_after_seconds": timeout, "steps_finished": len(steps),
                "video_step_seconds_service": None}
    res.pop("images_per_second", None)  # run_service's figure assumes 64 images a step
    res["samples"] = ctx["group"]
    res["samples_per_second"] = ctx["group"] / res["step_seconds"]
    res["timed_steps"] = max(0, len(res["steps"]) - 1)
    res["video_step_seconds_service"] = res["step_seconds"] if res["timed_steps"] else None
    print(f"  service step {res['step_seconds']:.2f} s (warm-up {res['warmup_step_seconds']:.1f} s): " +
          ", ".join(f"{k} {res[k]:.2f}" for k in ("rollout", "reward", "load", "train", "sync", "queue")), flush=True)
    return res


PARTS = {"rollout": rollout_part, "ltx2": ltx2_part, "inprocess": inprocess_part, "service": service_part}


# ----------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict:
    """Run the parts within the budget; write and return the `video` section."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu.video", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results", help="results folder (default: %(default)s)")
    p.add_argument("--budget-s", type=float, default=420.0, help="wall-clock seconds for everything (default 420)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (a test; numbers meaningless)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from {', '.join(PARTS)}")
    p.add_argument("--group", type=int, default=4, help="samples per RL step, one prompt (default 4)")
    p.add_argument("--steps", type=int, default=2, help="RL steps in-process and in the service (first = warm-up)")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="optimised path without torch.compile")
    p.add_argument("--work", default="/tmp/omnirl-video-bench", help="model directory and service runs")
    args = p.parse_args(argv)
    parts = [x for x in args.parts.split(",") if x]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        p.error(f"--parts: unknown {unknown}; choose from {', '.join(PARTS)}")
    if args.group < 2:
        p.error(f"--group {args.group}: FlowGRPO's group advantages need at least 2 samples")
    if args.steps < 2:
        p.error(f"--steps {args.steps}: the first step is warm-up, so at least 2")
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    if device.type == "cpu" and not args.smoke:
        p.error("no CUDA GPU here: run with --smoke for the CPU path")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    config, recipe = (WAN_TINY, SMOKE_RECIPE) if args.smoke else (WAN21_T2V_1_3B, RECIPE)
    work = Path(args.work) / ("smoke" if args.smoke else "full")
    work.mkdir(parents=True, exist_ok=True)
    peak = matmul_peak_tflops(device, n=8192 if device.type == "cuda" else 256, repeats=20 if device.type == "cuda"
                              else 2)
    _, build_s = timed(lambda: build_wan_dir(work / "wan", config, recipe["text_tokens"], str(device)), device)
    print(f"{name}: bf16 matmul peak {peak:.1f} TFLOP/s; model directory ready in {build_s:.1f} s", flush=True)
    ctx = {"device": device, "dtype": torch.bfloat16 if device.type == "cuda" else torch.float32, "config": config,
           "recipe": recipe, "group": args.group, "steps": args.steps, "max_batch": max(8, args.group),
           "compile": args.compile and device.type == "cuda", "peak": peak, "model_dir": work / "wan", "work": work,
           "smoke": args.smoke, "left": lambda: deadline - time.monotonic()}
    res: dict = {"device": name, "torch": torch.__version__, "model_config": config, "recipe": recipe,
                 "group": args.group, "rl_steps": args.steps, "matmul_peak_tflops": peak, "budget_s": args.budget_s,
                 "model_dir_seconds": build_s, "models": "Wan2.1-T2V-1.3B-sized transformer, random bf16 weights; "
                 "tiny random UMT5 (1 layer, width 4096) and AutoencoderKLWan (base 3); LTX-2 at real widths, "
                 "1 and 3 blocks" if not args.smoke else "tiny (smoke)", "skipped": {}}
    for part in PARTS:
        if part not in parts:
            res["skipped"][part] = "not in --parts"
            continue
        need = 1.0 if args.smoke else ESTIMATE_S[part]
        if ctx["left"]() < need:
            res["skipped"][part] = f"did not fit: {ctx['left']():.0f} s of --budget-s left, needs ~{need:.0f} s"
            print(f"=== {part}: skipped ({res['skipped'][part]})", flush=True)
            continue
        print(f"=== {part} ({ctx['left']():.0f} s left)", flush=True)
        start = time.monotonic()
        try:
            res[part] = PARTS[part](ctx)
            res[part]["part_seconds"] = time.monotonic() - start
        except Exception:  # record and go on: one broken part must not lose the others' numbers
            res["skipped"][part] = "failed: " + traceback.format_exc()[-3000:]
            print(res["skipped"][part], flush=True)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        sync(device)
    res["seconds"] = time.monotonic() - t0
    res["headline"] = {k: next((res[p][k] for p in PARTS if isinstance(res.get(p), dict) and k in res[p]), None)
                       for k in HEADLINE}
    path = results_path(args.out, name, args.smoke)
    merge_results(path, "video", res)
    if not args.smoke:
        data = json.loads(path.read_text())
        data["headline"] = {**data.get("headline", {}), **{k: v for k, v in res["headline"].items() if v is not None}}
        path.write_text(json.dumps(data, indent=1, default=float))
    print("=== headline")
    for k, v in res["headline"].items():
        print(f"  {k:32} {'skipped' if v is None else f'{v:.4g}'}")
    print(f"wrote {path} (key video) in {res['seconds']:.0f} s of a {args.budget_s:.0f} s budget")
    if args.smoke:
        shutil.rmtree(work / "runs", ignore_errors=True)
    return res


if __name__ == "__main__":
    main()
