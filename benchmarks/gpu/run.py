"""`make bench` on a CUDA GPU: rollout, actor, end-to-end and weight-sync benchmarks of an
SD3.5-Medium-sized transformer (random weights, bf16), printed as tables and written to
`benchmarks/results/<date>-<gpu>.json` (sections merge into the day's file, so a run may do
some sections and a later run the rest).

    python -m benchmarks.gpu.run [--sections rollout,packing,actor,e2e,sync] [--tiny] [--no-compile]

`--tiny` runs the same code on a small configuration (CPU smoke test, numbers meaningless).
Headline keys (definitions in benchmarks/README.md): rollout_speedup_uniform / _mixed (step-wise
÷ static images/s, same compiled kernels, streamed arrival), rollout_speedup_fragmented (packed ÷
static, `packing` section), rollout_mfu (step-wise, uniform),
actor_mfu (compiled LoRA FlowGRPO update, bypass), end_to_end_speedup (baseline ÷ omnirl step
seconds), lora_sync_seconds (cross-process weight sync of the LoRA adapters).
"""

from __future__ import annotations

import argparse
import gc
import json
import traceback

import torch

from benchmarks.gpu import actor, e2e, rollout
from benchmarks.gpu.common import matmul_peak_tflops, results_path
from benchmarks.gpu.fused_gelu import fuse_feedforward_gelu
from benchmarks.gpu.model import SD35_MEDIUM, TEXT_TOKENS, TINY, BenchSD3Adapter, build_transformer
from omnirl.api.spec import LoRASpec
from omnirl.models.compile import compile_adapter_module, compile_blocks
from omnirl.models.lora import prepare_rollout_module


def rollout_section(cfg: dict, device: torch.device, peak: float, args) -> dict:
    """Eager diffusers line (parameters trainable, as a diffusers pipeline holds them), then the
    engine on the model frozen as a rollout worker holds it (`prepare_rollout_module`; with
    `--fused-gelu` the experiment of `benchmarks.gpu.fused_gelu`): eager static, compile warm-up,
    then static vs step-wise on both workloads and arrivals."""
    adapter = BenchSD3Adapter(build_transformer(cfg, device), attention=args.attention)
    batch = min(32, args.requests // 4)
    out: dict = {"eager_diffusers": rollout.eager_diffusers(adapter.module, args.requests // 4, batch, 10, device,
                                                            peak, cfg, TEXT_TOKENS)}
    prepare_rollout_module(adapter, LoRASpec())  # frozen, as a rollout worker holds it
    if args.fused_gelu:
        fuse_feedforward_gelu(adapter.module)
    uniform = rollout.requests(adapter, args.requests // 2, mixed=False, seed=1)
    out["eager_engine_static"] = rollout.run_engine(adapter, uniform, "static", 32, "burst", device, peak, cfg)
    if args.compile:
        compile_adapter_module(adapter)
        out["warmup"] = rollout.warm_up(adapter, 32, device)
    runs = []
    for workload, n in (("uniform", args.requests), ("mixed", args.requests // 2)):
        reqs = rollout.requests(adapter, n, mixed=workload == "mixed", seed=2)
        for arrival in ("stream", "burst"):
            for batching in ("static", "stepwise"):
                row = {"workload": workload, **rollout.run_engine(adapter, reqs, batching, 32, arrival, device, peak,
                                                                  cfg)}
                runs.append(row)
                print(f"  {workload:8} {arrival:7} {batching:9} {row['images_per_second']:7.2f} img/s "
                      f"MFU {row['mfu']:.1%} mean batch {row['mean_batch']:.1f} recompiles {row['recompiles']}",
                      flush=True)
    out["runs"] = runs
    return out


def actor_section(cfg: dict, device: torch.device, peak: float, args) -> dict:
    """FlowGRPO update MFU, LoRA (bypass and recompute) and full parameters, eager and compiled."""
    source = BenchSD3Adapter(build_transformer(cfg, device), attention=args.attention)
    engine_reqs = rollout.requests(source, args.actor_samples, mixed=False, seed=3)
    from omnirl.rollout.engine import RolloutEngine

    engine = RolloutEngine(source, max_batch_size=32, device=device)
    for r in engine_reqs:
        engine.submit(r)
    results = engine.run_until_idle()
    del engine, source
    gc.collect()
    rewards = [float(r.image.float().mean()) for r in results]
    samples = actor.train_samples(results, rewards)
    out = {}
    for name, lora, mode in (("lora_bypass", True, "bypass"), ("lora_recompute", True, "recompute"),
                             ("full_bypass", False, "bypass")):
        adapter = BenchSD3Adapter(build_transformer(cfg, device), attention=args.attention)
        out[name] = actor.measure_update(adapter, samples, lora=lora, mode=mode, micro_batch=8, device=device,
                                         peak_tflops=peak, compile=args.compile)
        print(f"  {name}: " + ", ".join(f"{k} {out[name][k]['image_steps_per_second']:.1f} image-steps/s "
                                        f"MFU {out[name][k]['mfu']:.1%}" for k in ("eager", "compiled")
                                        if k in out[name]), flush=True)
        del adapter
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def e2e_section(cfg: dict, device: torch.device, peak: float, args) -> dict:
    """Step seconds of the baseline, the compiled baseline and omnirl's configuration."""
    out = {}
    for name in e2e.CONFIGS:
        if e2e.CONFIGS[name]["compile"] and not args.compile:
            continue
        out[name] = e2e.run_config(name, cfg, device, steps=args.e2e_steps, prompts=args.prompts)
        r = out[name]
        print(f"  {name:18} step {r['step_seconds']:6.2f} s (rollout+reward {r['rollout_reward_seconds']:.2f}, "
              f"train {r['train_seconds']:.2f}, sync {r['sync_seconds']:.3f}); warm-up step {r['warmup_step_seconds']:.1f} s",
              flush=True)
    return out


def sync_section(cfg: dict, device: torch.device, peak: float, args) -> dict:
    """Cross-process weight sync (actor → one rollout worker), LoRA adapters and full weights."""
    from benchmarks.gpu.weight_sync import measure_weight_sync

    return measure_weight_sync(cfg, str(device), lora_rank=32, repeats=3)


def compile_section(cfg: dict, device: torch.device, peak: float, args) -> dict:
    """Other ways to compile, same engine (step-wise, uniform, burst): regional with static shapes
    (one graph per batch size) and the whole transformer with dynamic shapes."""
    out = {}
    for name in ("regional-static", "whole-dynamic"):
        adapter = BenchSD3Adapter(build_transformer(cfg, device), attention=args.attention)
        prepare_rollout_module(adapter, LoRASpec())
        if name == "regional-static":
            compile_blocks(adapter.module, adapter.compile_block_types, dynamic=False)
        else:
            adapter.module.compile(dynamic=True)
        warm = rollout.run_engine(adapter, rollout.requests(adapter, 32, False, 9), "stepwise", 32, "burst", device,
                                  peak, cfg)
        row = rollout.run_engine(adapter, rollout.requests(adapter, args.requests, False, 2), "stepwise", 32, "burst",
                                 device, peak, cfg)
        out[name] = {"warmup_seconds": warm["seconds"], "graphs": warm["recompiles"], **row}
        print(f"  {name:16} warm-up {warm['seconds']:.1f} s, {row['images_per_second']:.2f} img/s MFU {row['mfu']:.1%}",
              flush=True)
        del adapter
        gc.collect()
    return out


def _frozen_adapter(cfg: dict, device: torch.device, args) -> BenchSD3Adapter:
    """The benchmark model as a rollout worker holds it: frozen, compiled unless `--no-compile`
    (bf16 on a GPU, float32 on a CPU, whose bf16 matmuls crawl)."""
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    adapter = BenchSD3Adapter(build_transformer(cfg, device, dtype), attention=args.attention)
    prepare_rollout_module(adapter, LoRASpec())
    if args.compile:
        compile_adapter_module(adapter)
    return adapter


def packing_section(cfg: dict, device: torch.device, peak: float, args) -> dict:
    """Static vs step-wise (shape buckets) vs packed (mixed shapes in one forward), same compiled
    kernels, on the fragmented, mixed and uniform workloads, stream and burst arrival; each (workload, batching) runs once unmeasured first (compiled graphs, prompt cache, allocator)."""
    adapter = _frozen_adapter(cfg, device, args)
    frag = rollout.FRAGMENTED_GROUP
    if args.tiny:  # CPU smoke test: a quarter of each side, every workload in groups of 4
        sizes = [(h // 4, w // 4) for h, w in rollout.FRAGMENTED_SIZES]
        workloads = {name: (rollout.fragmented_requests(adapter, args.requests // 2, seed=5, sizes=s), frag)
                     for name, s in (("fragmented", sizes), ("mixed", sizes[:3:2]), ("uniform", sizes[:1]))}
    else:
        workloads = {
            "fragmented": (rollout.fragmented_requests(adapter, args.requests // 2, seed=5), frag),
            "mixed": (rollout.requests(adapter, args.requests // 2, mixed=True, seed=2), rollout.GROUP),
            "uniform": (rollout.requests(adapter, args.requests, mixed=False, seed=2), rollout.GROUP),
        }
    runs = _batching_runs(adapter, workloads, device, peak, cfg)
    return {"runs": runs, "fragmented_sizes": rollout.FRAGMENTED_SIZES}


def packing_sparse_section(cfg: dict, device: torch.device, peak: float, args) -> dict:
    """Static vs step-wise vs packed on the sparse workloads: groups of 1 and of 2 over the 8
    SPARSE_SIZES (`--requests`/2 images each), same compiled kernels."""
    adapter = _frozen_adapter(cfg, device, args)
    sizes = [(h // 4, w // 4) for h, w in rollout.SPARSE_SIZES] if args.tiny else rollout.SPARSE_SIZES
    workloads = {f"sparse-g{g}": (rollout.fragmented_requests(adapter, args.requests // 2, seed=7, sizes=sizes, group=g), g)
                 for g in (1, 2)}
    return {"runs": _batching_runs(adapter, workloads, device, peak, cfg), "sizes": rollout.SPARSE_SIZES}


def packing_small_section(cfg: dict, device: torch.device, peak: float, args) -> dict:
    """Static vs step-wise vs packed on the small workloads: groups of 4 and of 8 over the 6
    SMALL_SIZES (below 512²; `--requests`/2 images each), same compiled kernels."""
    adapter = _frozen_adapter(cfg, device, args)
    sizes = [(h // 4, w // 4) for h, w in rollout.SMALL_SIZES] if args.tiny else rollout.SMALL_SIZES
    workloads = {f"small-g{g}": (rollout.fragmented_requests(adapter, args.requests // 2, seed=9, sizes=sizes, group=g), g)
                 for g in (4, 8)}
    return {"runs": _batching_runs(adapter, workloads, device, peak, cfg), "sizes": rollout.SMALL_SIZES}


def _batching_runs(adapter, workloads: dict, device: torch.device, peak: float, cfg: dict) -> list[dict]:
    """Each workload under static, step-wise and packed batching, stream and burst arrival; each
    (workload, batching) first runs once unmeasured (compiled graphs, prompt cache, allocator)."""
    runs = []
    for workload, (reqs, group) in workloads.items():
        for batching in ("static", "stepwise", "packed"):
            rollout.run_engine(adapter, reqs, batching, 32, "stream", device, peak, cfg, group)
            for arrival in ("stream", "burst"):
                row = {"workload": workload, **rollout.run_engine(adapter, reqs, batching, 32, arrival, device, peak,
                                                                  cfg, group)}
                runs.append(row)
                print(f"  {workload:10} {arrival:7} {batching:9} {row['images_per_second']:7.2f} img/s "
                      f"MFU {row['mfu']:.1%} mean batch {row['mean_batch']:.1f} recompiles {row['recompiles']}",
                      flush=True)
    return runs


SECTIONS = {"rollout": rollout_section, "packing": packing_section, "packing_sparse": packing_sparse_section,
            "packing_small": packing_small_section, "compile": compile_section, "actor": actor_section, "e2e": e2e_section, "sync": sync_section}


def headline(res: dict) -> dict:
    """The summary keys the issue asks for, from whatever sections the file holds."""
    h: dict = {}
    runs = res.get("rollout", {}).get("runs", [])

    def ips(workload, arrival, batching):
        return next(r["images_per_second"] for r in runs
                    if (r["workload"], r["arrival"], r["batching"]) == (workload, arrival, batching))

    if runs:
        for w in ("uniform", "mixed"):
            h[f"rollout_speedup_{w}"] = ips(w, "stream", "stepwise") / ips(w, "stream", "static")
            h[f"rollout_speedup_{w}_burst"] = ips(w, "burst", "stepwise") / ips(w, "burst", "static")
        h["rollout_mfu"] = next(r["mfu"] for r in runs if (r["workload"], r["arrival"], r["batching"])
                                == ("uniform", "stream", "stepwise"))
        h["rollout_vs_eager_diffusers"] = ips("uniform", "stream", "stepwise") / \
            res["rollout"]["eager_diffusers"]["images_per_second"]
    packing = res.get("packing", {}).get("runs", [])
    if packing:
        def pips(workload, arrival, batching):
            return next(r["images_per_second"] for r in packing
                        if (r["workload"], r["arrival"], r["batching"]) == (workload, arrival, batching))

        h["rollout_speedup_fragmented"] = pips("fragmented", "stream", "packed") / pips("fragmented", "stream", "static")
        for w in ("fragmented", "mixed", "uniform"):
            for arrival, suffix in (("stream", ""), ("burst", "_burst")):
                h[f"rollout_packed_vs_static_{w}{suffix}"] = pips(w, arrival, "packed") / pips(w, arrival, "static")
                h[f"rollout_packed_vs_stepwise_{w}{suffix}"] = pips(w, arrival, "packed") / pips(w, arrival, "stepwise")
    for section, name, groups in (("packing_sparse", "sparse", (1, 2)), ("packing_small", "small", (4, 8))):
        runs_of = res.get(section, {}).get("runs", [])
        for g in groups:
            rows = {(r["arrival"], r["batching"]): r["images_per_second"] for r in runs_of
                    if r["workload"] == f"{name}-g{g}"}
            if rows:
                h[f"rollout_speedup_{name}_g{g}"] = rows[("stream", "packed")] / rows[("stream", "static")]
                h[f"rollout_packed_vs_stepwise_{name}_g{g}"] = rows[("stream", "packed")] / rows[("stream", "stepwise")]
    act = res.get("actor", {})
    if "lora_bypass" in act:
        best = act["lora_bypass"].get("compiled", act["lora_bypass"]["eager"])
        h["actor_mfu"] = best["mfu"]
    if "full_bypass" in act:
        h["actor_mfu_full"] = act["full_bypass"].get("compiled", act["full_bypass"]["eager"])["mfu"]
    e = res.get("e2e", {})
    if "baseline" in e and "omnirl" in e:
        h["end_to_end_speedup"] = e["baseline"]["step_seconds"] / e["omnirl"]["step_seconds"]
    if "baseline-compiled" in e and "omnirl" in e:
        h["end_to_end_speedup_same_kernels"] = e["baseline-compiled"]["step_seconds"] / e["omnirl"]["step_seconds"]
    multires = res.get("service_multires", {})  # written from `benchmarks.gpu.service --configs multires…`
    if "service_packed_speedup_small" in multires:
        h["service_packed_speedup_small"] = multires["service_packed_speedup_small"]
    # written by `python -m benchmarks.gpu.video` (its own budgeted run): keep its keys when this suite rewrites the headline
    h.update({k: v for k, v in res.get("video", {}).get("headline", {}).items() if v is not None})
    s = res.get("sync", {})
    for key in ("lora_sync_seconds", "full_sync_seconds"):
        if key in s:
            h[key] = s[key]
    return h


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", default="rollout,actor,e2e,sync",
                   help=f"comma-separated, from: {', '.join(SECTIONS)} (default: %(default)s)")
    p.add_argument("--tiny", action="store_true", help="small configuration (CPU smoke test; MFU is not reported)")
    p.add_argument("--attention", default="auto", help="SDPA backend the blocks run: auto (as omnirl run: "
                   "cuDNN on Hopper in bf16), torch (torch's choice), cudnn, flash, efficient or math (default %(default)s)")
    p.add_argument("--fused-gelu", action="store_true", help="rollout section: feed-forward GELU in the GEMM "
                   "epilogue (benchmarks/gpu/fused_gelu.py; an experiment the product does not run)")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="eager kernels only")
    p.add_argument("--requests", type=int, default=256, help="uniform rollout requests (mixed: half)")
    p.add_argument("--actor-samples", type=int, default=32)
    p.add_argument("--prompts", type=int, default=8, help="prompts per end-to-end step (× group 8)")
    p.add_argument("--e2e-steps", type=int, default=3, help="end-to-end steps per configuration (first = warm-up)")
    p.add_argument("--out", default="benchmarks/results", help="results folder (default: %(default)s)")
    args = p.parse_args()
    unknown = sorted(set(args.sections.split(",")) - set(SECTIONS))
    if unknown:
        p.error(f"unknown --sections {unknown}; choose from {', '.join(SECTIONS)}")
    if args.requests < 2 * rollout.GROUP:  # else the mixed workload (half) has no group and a ratio divides by 0
        p.error(f"--requests {args.requests} is too few: the workloads are groups of {rollout.GROUP} and the mixed one "
                f"takes half, so use at least {2 * rollout.GROUP}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = TINY if args.tiny else SD35_MEDIUM
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    path = results_path(args.out, gpu, args.tiny)
    res = json.loads(path.read_text()) if path.exists() else {}
    peak = matmul_peak_tflops(device, n=8192 if device.type == "cuda" else 512, repeats=20 if device.type == "cuda" else 3)
    res.update({"device": gpu, "torch": torch.__version__, "model_config": cfg, "text_tokens": TEXT_TOKENS,
                "matmul_peak_tflops": peak, "compile": args.compile})
    print(f"{gpu}: measured bf16 matmul peak {peak:.1f} TFLOP/s", flush=True)
    failed = []
    for name in args.sections.split(","):
        print(f"=== {name}", flush=True)
        try:
            res[name] = {**SECTIONS[name](cfg, device, peak, args), "sdpa_backend": args.attention}
        except Exception:  # one broken section must not lose the others' numbers; exit code says it failed
            res.setdefault("errors", {})[name] = traceback.format_exc()
            print(res["errors"][name], flush=True)
            failed.append(name)
        res["headline"] = headline(res)
        if device.type == "cpu":  # a CPU has no bf16 matmul peak worth the name: no MFU claims
            res["headline"] = {k: v for k, v in res["headline"].items() if "mfu" not in k}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res, indent=1, default=float))
    print("=== headline")
    for k, v in res["headline"].items():
        print(f"  {k:34} {v:.3f}")
    print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
