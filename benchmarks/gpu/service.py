"""The service measured as users run it: `omnirl run` of the SD3.5-Medium-sized model on GPUs.

Real role processes (rollout, reward, actor, controller), a real `redis-server`, samples through
the TransferQueue and the real weight broadcast — against the in-process end-to-end step
(`benchmarks.gpu.e2e`, the same model, LoRA and 8 prompts × 8 samples at 512²).

The model directory is a real diffusers SD3 layout loaded through `omnirl.models.diffusers.sd3`:
the SD3.5-Medium transformer (2.24 B parameters, random bf16 weights) with text encoders and a VAE
of tiny random configurations whose output sizes are SD3.5's (CLIP pooled 768 + 1280, T5 width
4096, 16 latent channels, ×8 VAE), so the denoiser — the cost the in-process bench measures —
sees exactly the real shapes (333 text tokens). Reward: JPEG compressibility on the CPU.

    python -m benchmarks.gpu.service [--configs omnirl,baseline] [--steps 4] [--tiny]

One GPU: rollout and actor share it (`--share-gpus`, broadcast over CUDA IPC). Two GPUs (when the
machine has them): `omnirl-2gpu`, rollout and actor on a GPU each, `fully-async`, NCCL.
`multires` / `multires-packed`: the omnirl configuration with `model.resolutions` = the 6 sizes
below 512² of `benchmarks.gpu.rollout.SMALL_SIZES`, shape buckets vs packed batching.
`--tiny` runs a small configuration on the CPU (a smoke test; numbers meaningless).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

from benchmarks.gpu.model import SD35_MEDIUM, TINY
from benchmarks.gpu.rollout import SMALL_SIZES

ROOT = Path(__file__).resolve().parents[2]
INPROCESS_STEP_SECONDS = 8.71
"""The in-process omnirl step (`e2e.omnirl.step_seconds` of 2026-12-01-nvidia-h200.json: cuDNN
attention, as `spec.model.attention: auto` runs the service on an H200)."""

CONFIGS = {
    # name: (pipeline mode, rollout correction, batching, compile, GPUs, several sizes)
    "omnirl": ("async-reward", "bypass", "stepwise", True, 1, False),
    "baseline": ("sync", "recompute", "static", False, 1, False),
    "omnirl-2gpu": ("fully-async", "bypass", "stepwise", True, 2, False),
    # model.resolutions = SMALL_SIZES (6 sizes below 512², groups dealt in turn): shape buckets vs packed
    "multires": ("async-reward", "bypass", "stepwise", True, 1, True),
    "multires-packed": ("async-reward", "bypass", "packed", True, 1, True),
}


def build_model_dir(path: Path, transformer_config: dict, device: str, seed: int = 0) -> Path:
    """Save an SD3 diffusers directory: the given transformer (random bf16) + tiny encoders and VAE."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import (
        CLIPTextConfig,
        CLIPTextModelWithProjection,
        CLIPTokenizer,
        T5Config,
        T5EncoderModel,
        T5TokenizerFast,
    )

    if (path / "model_index.json").exists():
        return path
    torch.manual_seed(seed)
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for ch in sorted(ByteLevel.alphabet()):
        vocab.setdefault(ch, len(vocab))
        vocab.setdefault(ch + "</w>", len(vocab))
    width = transformer_config["joint_attention_dim"]
    pooled = transformer_config["pooled_projection_dim"]
    clips = []
    for proj, pad in ((pooled * 3 // 8, "<|endoftext|>"), (pooled - pooled * 3 // 8, "!")):  # 768 + 1280 = 2048
        tok = CLIPTokenizer(vocab=vocab, merges=[], pad_token=pad, model_max_length=77)
        cfg = CLIPTextConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=2, projection_dim=proj, max_position_embeddings=77,
                             bos_token_id=0, eos_token_id=1, pad_token_id=1)
        clips.append((CLIPTextModelWithProjection(cfg).eval(), tok))
    t5_vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    t5_vocab += [(ch, -3.0) for ch in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789\"'"]
    t5 = T5EncoderModel(T5Config(vocab_size=len(t5_vocab), d_model=width, d_kv=64, d_ff=256, num_layers=1,
                                 num_heads=4, relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1,
                                 decoder_start_token_id=0)).eval()
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(32, 32, 32, 32),
                        layers_per_block=1, latent_channels=transformer_config["in_channels"], norm_num_groups=8,
                        shift_factor=0.0609, scaling_factor=1.5035, use_quant_conv=False, use_post_quant_conv=False)
    with torch.device(device):
        transformer = SD3Transformer2DModel(**transformer_config)
    parts = {"transformer": transformer.to(torch.bfloat16), "vae": vae, "text_encoder": clips[0][0],
             "text_encoder_2": clips[1][0], "text_encoder_3": t5}
    for name, module in parts.items():
        module.save_pretrained(path / name, safe_serialization=True)
    for name, tok in (("tokenizer", clips[0][1]), ("tokenizer_2", clips[1][1]),
                      ("tokenizer_3", T5TokenizerFast(vocab=t5_vocab, extra_ids=0))):
        tok.save_pretrained(path / name)
    FlowMatchEulerDiscreteScheduler(shift=3.0).save_pretrained(path / "scheduler")
    index = {"_class_name": "StableDiffusion3Pipeline", "_diffusers_version": "0.32.0",
             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "transformer": ["diffusers", "SD3Transformer2DModel"], "vae": ["diffusers", "AutoencoderKL"],
             **{f"text_encoder{s}": ["transformers", "CLIPTextModelWithProjection"] for s in ("", "_2")},
             "text_encoder_3": ["transformers", "T5EncoderModel"],
             **{f"tokenizer{s}": ["transformers", "CLIPTokenizer"] for s in ("", "_2")},
             "tokenizer_3": ["transformers", "T5TokenizerFast"]}
    (path / "model_index.json").write_text(json.dumps(index, indent=2))
    del transformer
    return path


def job_manifest(path: Path, model_dir: Path, config: str, *, steps: int, side: int, device: str) -> Path:
    """The benchmark RLJob: FlowGRPO with LoRA r32, 8 prompts × 8 samples, 10 denoising steps."""
    mode, correction, batching, compile_, gpus, several = CONFIGS[config]
    acc = {"type": "nvidia", "count": 1} if device == "cuda" else {"type": "cpu"}
    scale = 512 // side  # --tiny: every size shrunk as the single side is
    size = {"resolutions": [[h // scale, w // scale] for h, w in SMALL_SIZES]} if several else {"resolution": [side, side]}
    doc = {
        "apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": f"service-{config}"},
        "spec": {
            "model": {"family": "sd3", "path": str(model_dir), "dtype": "bfloat16", **size,
                      "compile": compile_ and device == "cuda", "lora": {"enabled": True, "rank": 32, "alpha": 64}},
            "data": {"trainPrompts": str(ROOT / "examples/prompts/ocr-train.txt"),
                     "validationPrompts": str(ROOT / "examples/prompts/ocr-heldout.txt")},
            "algorithm": {
                "name": "flow-grpo", "steps": steps, "groupSize": 8, "promptsPerStep": 8,
                "sampling": {"numSteps": 10, "shift": 3.0, "guidanceScale": 1.0},
                "optimizer": {"learningRate": 1e-6, "microBatchSize": 8, "updatesPerStep": 1},
                "flowGrpo": {"sdeType": "cps", "noiseLevel": 0.8, "window": {"size": 3, "range": [0, 6]},
                             "clipRange": 1e-4, "klCoef": 0.0, "rolloutCorrection": {"mode": correction}},
            },
            "reward": [{"name": "jpeg", "kind": "jpeg"}],
            "pipeline": {"mode": mode, "maxStaleness": 1},
            "validation": {"everySteps": 0, "numSteps": 2, "maxPrompts": 1},
            "checkpoint": {"everySteps": 0, "keep": 1},
            "roles": {"rollout": {"accelerator": acc, "batching": batching, "maxBatchSize": 32},
                      "actor": {"accelerator": acc}, "reward": {"batchSize": 8}},
        },
    }
    out = path / f"{config}.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def run_service(job: Path, out: Path, *, share: bool, device: str, timeout_s: int) -> dict:
    """`omnirl run` the job; per-step phases from its metrics.jsonl (the first step is warm-up)."""
    cmd = [sys.executable, "-m", "omnirl.cli", "run", str(job), "--out", str(out), "--no-ray"]
    cmd += ["--share-gpus"] if share else []
    cmd += ["--device", "cpu"] if device == "cpu" else []
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"omnirl run exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [phases(r) for r in rows if r["event"] == "step"]
    timed = steps[1:] or steps
    mean = {k: sum(s[k] for s in timed) / len(timed) for k in timed[0]}
    return {"wall_seconds": wall, "steps": steps, "warmup_step_seconds": steps[0]["step_seconds"], **mean,
            "images_per_second": 64 / mean["step_seconds"],
            "placement": [line for line in proc.stdout.splitlines() if line.startswith("  ")][:8]}


def phases(r: dict) -> dict:
    """A step's seconds by phase, from the controller's record (they add up to `step_seconds`).

    rollout: publish → last sample generated; reward: the scoring tail after that; handoff:
    last score → batch handed to the actor (advantages, the control message); load: the actor
    fetching the batch's tensors from the TransferQueue; train: the update; sync: the weight
    broadcast; queue: the rest (messages, waits between roles).
    """
    step, trained = r["step_seconds"], r["handoff_to_trained_seconds"]
    out = {"step_seconds": step, "rollout": r["rollout_seconds"], "reward": r["reward_seconds"] - r["rollout_seconds"],
           "handoff": step - trained - r["reward_seconds"], "load": r["load_seconds"], "train": r["train_seconds"],
           "sync": r["sync_seconds"]}
    out["queue"] = trained - r["load_seconds"] - r["train_seconds"] - r["sync_seconds"]
    return out


def main(argv: list[str] | None = None) -> dict:
    """Run the configurations; print a table; return {config: result} plus the headline ratios."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="omnirl,baseline,omnirl-2gpu")
    p.add_argument("--steps", type=int, default=4, help="RL steps per run (the first is warm-up)")
    p.add_argument("--work", default="/tmp/omnirl-service-bench")
    p.add_argument("--tiny", action="store_true", help="small model on the CPU (smoke test)")
    p.add_argument("--timeout", type=int, default=1500)
    args = p.parse_args(argv)
    device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model_dir = build_model_dir(work / ("model-tiny" if args.tiny else "model-sd35m"), TINY if args.tiny else SD35_MEDIUM,
                                device)
    print(f"model directory {model_dir} ready in {time.perf_counter() - t0:.1f} s", flush=True)
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    results: dict = {}
    for config in args.configs.split(","):
        need = CONFIGS[config][4]
        if device == "cuda" and need > gpus:
            print(f"{config}: needs {need} GPUs, this machine has {gpus} — skipped", flush=True)
            continue
        job = job_manifest(work, model_dir, config, steps=args.steps, side=128 if args.tiny else 512, device=device)
        out = work / f"run-{config}-{int(time.time())}"
        results[config] = run_service(job, out, share=device == "cuda" and need == 1, device=device,
                                      timeout_s=args.timeout)
        r = results[config]
        print(f"{config:<12} step {r['step_seconds']:.2f} s ({r['images_per_second']:.2f} img/s; warm-up "
              f"{r['warmup_step_seconds']:.1f} s): " + ", ".join(f"{k} {r[k]:.2f}" for k in
                                                              ("rollout", "reward", "handoff", "load", "train", "sync", "queue")),
              flush=True)
    if "omnirl" in results:
        results["service_step_seconds"] = results["omnirl"]["step_seconds"]
        results["service_vs_inprocess"] = results["omnirl"]["step_seconds"] / INPROCESS_STEP_SECONDS
        if "baseline" in results:
            results["service_speedup_vs_baseline"] = results["baseline"]["step_seconds"] / results["omnirl"]["step_seconds"]
        if "omnirl-2gpu" in results:
            results["service_two_gpu_speedup"] = (results["omnirl-2gpu"]["images_per_second"]
                                                  / results["omnirl"]["images_per_second"])
    if "multires" in results and "multires-packed" in results:
        results["service_packed_speedup_small"] = (results["multires-packed"]["images_per_second"]
                                                   / results["multires"]["images_per_second"])
    print(json.dumps({k: v for k, v in results.items() if not isinstance(v, dict)}, indent=2), flush=True)
    return results


if __name__ == "__main__":
    res = main()
    # under build/ (git-ignored), not the working directory: a smoke run's numbers are no record; a GPU run's go into
    # the day's benchmarks/results/<date>-<gpu>.json by hand (its `service_multires`, read by benchmarks.gpu.run)
    out = Path(__file__).resolve().parents[2] / "build" / "service-results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")
