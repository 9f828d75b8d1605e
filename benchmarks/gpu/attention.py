"""Where a compiled rollout forward spends its time, and what each SDPA backend and CUDA graphs change.

    python -m benchmarks.gpu.attention [--backends flash,cudnn,efficient] [--batch 32] [--engine]

Three measurements on the SD3.5-Medium-sized transformer (random bf16, 512², 333 text tokens):
- `kernels`: `scaled_dot_product_attention` alone at the rollout's two shapes ([B, 24, 1357, 64]
  joint and [B, 24, 1024, 64] image-only), and the joint shape's FLOPs at head dim 128
  ([B, 12, 1357, 128], `joint_d128`), per backend: ms, TFLOP/s (4·B·H·S²·d) and the largest
  difference from the fp32 math reference.
- `forward`: per backend, the regionally compiled transformer (as the rollout compiles it) at
  batch B: ms per forward (mean of 10, CUDA events), MFU, GPU kernel time by kind (matmul,
  attention, other) from the profiler, the ten slowest "other" kernels, and the same forward
  replayed as one captured CUDA graph (what launch gaps cost).
- `engine` (`--engine`): the step-wise engine on the uniform burst workload per backend (MFU as
  `benchmarks.gpu.run`'s `rollout_mfu`).

The forward and engine runs set the backend inside each block (`omnirl.models.attention.use_backend`),
so the compiled graphs hold that backend's kernel. Results merge into
`benchmarks/results/<date>-<gpu>.json` under `--key` (default `attention`).
"""

from __future__ import annotations

import argparse
import gc
import re
import time
from collections import defaultdict

import torch
import torch._inductor.config  # noqa: F401  (the "aggr" variant patches it)
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from benchmarks.gpu import rollout
from benchmarks.gpu.common import matmul_peak_tflops, merge_results, mfu, results_path, sync
from benchmarks.gpu.flops import sd3_forward_flops
from benchmarks.gpu.fused_gelu import fuse_feedforward_gelu, linear_gelu_tanh
from benchmarks.gpu.model import SD35_MEDIUM, TEXT_TOKENS, TINY, BenchSD3Adapter, build_transformer
from omnirl.api.spec import LoRASpec
from omnirl.models import compile as compile_options
from omnirl.models.attention import BACKENDS
from omnirl.models.compile import compile_adapter_module
from omnirl.models.lora import inject_lora

VARIANT_PARTS = {"frozen", "lora", "gelu", "untuned", "aggr"}
INDUCTOR_VARIANTS = {"aggr": "aggressive_fusion"}
"""Variant parts that switch an Inductor option on while the blocks compile (lazily, at first call)."""
MATMUL = re.compile(r"gemm|nvjet|cutlass|xmma|cublas|sm90_|matmul", re.I)
ATTENTION = re.compile(r"flash|fmha|attention|sdpa|cudnn", re.I)


def kernel_kind(name: str) -> str:
    """'attention', 'matmul' or 'other' from a CUDA kernel's name."""
    return "attention" if ATTENTION.search(name) else "matmul" if MATMUL.search(name) else "other"


def cuda_ms(fn, repeats: int) -> float:
    """Mean milliseconds of `fn()` over `repeats` calls, timed with CUDA events after one warm call."""
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


def kernels(backends: list[str], batch: int, device, peak: float) -> dict:
    """SDPA alone at the rollout's joint and image-only shapes, per backend."""
    out = {}
    # joint_d128: the joint shape's FLOPs at head dim 128 (half the heads), which the model does not
    # run: the ratio to "joint" shows what head dim 64's one exp per 256 matmul FLOPs costs.
    for name, seq, heads, dim in (("joint", 1024 + TEXT_TOKENS, 24, 64), ("image", 1024, 24, 64),
                                  ("joint_d128", 1024 + TEXT_TOKENS, 12, 128)):
        q, k, v = (torch.randn(batch, heads, seq, dim, device=device, dtype=torch.bfloat16) for _ in range(3))
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
        flops = 4.0 * batch * heads * seq * seq * dim
        for backend in backends:
            try:
                with sdpa_kernel([BACKENDS[backend]]):  # this kernel only, no fallback
                    got = F.scaled_dot_product_attention(q, k, v)
                    ms = cuda_ms(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v), 20)
            except RuntimeError as e:  # a backend that cannot run this shape: say so, go on
                out[f"{name}/{backend}"] = {"error": str(e).splitlines()[0]}
                continue
            tflops = flops / ms / 1e9
            out[f"{name}/{backend}"] = {"ms": ms, "tflops": tflops, "of_peak": tflops / peak,
                                        "max_abs_err": float((got.float() - ref).abs().max())}
            print(f"  sdpa {name:10} [{batch},{heads},{seq},{dim}] {backend:9} {ms:7.3f} ms {tflops:6.1f} TFLOP/s "
                  f"({tflops / peak:.1%} of peak) max |err| {out[f'{name}/{backend}']['max_abs_err']:.2e}", flush=True)
    return out


def _inputs(cfg: dict, batch: int, device) -> dict:
    g = torch.Generator(device=device).manual_seed(0)
    bf = dict(device=device, dtype=torch.bfloat16, generator=g)
    return {"hidden_states": torch.randn(batch, 16, 64, 64, **bf),
            "encoder_hidden_states": torch.randn(batch, TEXT_TOKENS, cfg["joint_attention_dim"], **bf),
            "pooled_projections": torch.randn(batch, cfg["pooled_projection_dim"], **bf),
            "timestep": torch.full((batch,), 500.0, device=device)}


def forward(adapter, backend: str, cfg: dict, batch: int, device, peak: float) -> dict:
    """One backend's compiled forward: ms, MFU, kernel time by kind, slowest other kernels, CUDA graph replay."""
    module, inputs = adapter.module, _inputs(cfg, batch, device)
    flops = batch * sd3_forward_flops(cfg, (64, 64), TEXT_TOKENS)
    with torch.no_grad():
        def run():
            return module(**inputs, return_dict=False)[0]

        t0 = time.perf_counter()
        run()  # compile + autotune (+ coordinate descent, `INDUCTOR_OPTIONS`) + allocator
        sync(device)
        first_call_s = time.perf_counter() - t0
        for _ in range(2):
            run()
        ms = cuda_ms(run, 10)
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
            sync(device)
        by_kind: dict[str, float] = defaultdict(float)
        others: dict[str, float] = defaultdict(float)
        for e in prof.key_averages():
            us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            if us <= 0 or e.key.startswith("ProfilerStep"):
                continue
            kind = kernel_kind(e.key)
            by_kind[kind] += us / 1e3
            if kind == "other":
                others[e.key[:120]] += us / 1e3
        graph_ms = None
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    run()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run()
            graph_ms = cuda_ms(graph.replay, 10)
        except Exception as e:  # capture is a measurement here, not a product path: report why it failed
            print(f"  {backend}: CUDA graph capture failed: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
    busy = sum(by_kind.values())
    row = {"ms": ms, "mfu": mfu(flops, ms / 1e3, peak), "first_call_s": first_call_s, "kernel_ms": dict(by_kind), "busy_ms": busy,
           "slowest_other": sorted(others.items(), key=lambda kv: -kv[1])[:10], "graph_ms": graph_ms,
           "graph_mfu": mfu(flops, graph_ms / 1e3, peak) if graph_ms else None}
    print(f"  forward {backend:9} batch {batch}: {ms:7.1f} ms MFU {row['mfu']:.1%}; kernels "
          + ", ".join(f"{k} {v:.1f} ms" for k, v in sorted(by_kind.items()))
          + (f"; CUDA graph {graph_ms:.1f} ms MFU {row['graph_mfu']:.1%}" if graph_ms else "")
          + f"; first call (compile) {first_call_s:.1f} s", flush=True)
    for key, v in row["slowest_other"]:
        print(f"      {v:6.2f} ms  {key}", flush=True)
    return row


def engine(adapter, backend: str, cfg: dict, requests: int, device, peak: float) -> dict:
    """Step-wise engine, uniform workload, burst arrival, batch 32, with this backend."""
    rollout.run_engine(adapter, rollout.requests(adapter, 64, False, 9), "stepwise", 32, "burst", device, peak, cfg)
    row = rollout.run_engine(adapter, rollout.requests(adapter, requests, False, 2), "stepwise", 32, "burst",
                             device, peak, cfg)
    print(f"  engine {backend:9} {row['images_per_second']:.2f} img/s MFU {row['mfu']:.1%} "
          f"mean batch {row['mean_batch']:.1f}", flush=True)
    return row


def ffn_kernels(batch: int, device) -> dict:
    """The feed-forward's first projection + tanh-GELU at 512² batch `batch` ([B·1357, 1536] → 6144):
    addmm then a GELU kernel against `linear_gelu_tanh` (cuBLASLt epilogue); ms and largest difference."""
    x = torch.randn(batch * (1024 + TEXT_TOKENS), 1536, device=device, dtype=torch.bfloat16)
    w = torch.randn(6144, 1536, device=device, dtype=torch.bfloat16) / 40
    b = torch.randn(6144, device=device, dtype=torch.bfloat16)
    unfused = lambda: F.gelu(F.linear(x, w, b), approximate="tanh")  # noqa: E731
    fused = lambda: linear_gelu_tanh(x, w, b)  # noqa: E731
    row = {"unfused_ms": cuda_ms(unfused, 20), "fused_ms": cuda_ms(fused, 20),
           "max_abs_diff": float((unfused().float() - fused().float()).abs().max()),
           "max_abs": float(unfused().float().abs().max())}
    print(f"  ffn [{x.shape[0]},1536]→6144: unfused {row['unfused_ms']:.3f} ms, fused {row['fused_ms']:.3f} ms, "
          f"max |diff| {row['max_abs_diff']:.2e} of max |y| {row['max_abs']:.2f}", flush=True)
    return row


def per_backend(backend: str, cfg: dict, args, device, peak: float, variant: str = "plain") -> dict:
    """A fresh compiled transformer for `backend`: its forward, then (--engine) the engine.

    `variant`: "plain", or "+"-joined "frozen" (parameters without requires_grad, as a rollout
    worker holds them), "lora" (peft LoRA r 32 on SD3's targets, unmerged, as a rollout worker
    holds it), "gelu" (`benchmarks.gpu.fused_gelu`), "untuned" (without the product's
    `omnirl.models.compile.INDUCTOR_OPTIONS`: Inductor's defaults) and "aggr" (aggressive fusion)."""
    parts = variant.split("+")
    options = {INDUCTOR_VARIANTS[p]: True for p in parts if p in INDUCTOR_VARIANTS}
    product = dict(compile_options.INDUCTOR_OPTIONS)
    try:
        if "untuned" in parts:  # compile_kwargs reads the dict when the blocks compile
            compile_options.INDUCTOR_OPTIONS.clear()
        with torch._inductor.config.patch(options):
            return _per_backend(backend, cfg, args, device, peak, variant)
    finally:
        compile_options.INDUCTOR_OPTIONS.update(product)


def _per_backend(backend: str, cfg: dict, args, device, peak: float, variant: str) -> dict:
    torch._dynamo.reset()
    adapter = BenchSD3Adapter(build_transformer(cfg, device), attention=backend)
    parts = set(variant.split("+")) - {"plain"}
    if parts - VARIANT_PARTS:
        raise SystemExit(f"--variants: unknown {sorted(parts - VARIANT_PARTS)} in {variant!r}; "
                         f"use plain or +-joined {sorted(VARIANT_PARTS)}")
    if "lora" in parts:
        inject_lora(adapter.module, LoRASpec(enabled=True, rank=32, alpha=64), adapter.lora_target_modules)
    if "frozen" in parts:  # after LoRA, as a rollout worker's `prepare_rollout_module` does
        adapter.module.requires_grad_(False)
    if "gelu" in parts:
        print(f"  {variant}: fused {fuse_feedforward_gelu(adapter.module)} feed-forward GELUs", flush=True)
    compile_adapter_module(adapter, mode=args.mode)
    label = backend if variant == "plain" else f"{backend}/{variant}"
    out = {"forward": forward(adapter, label, cfg, args.batch, device, peak)}
    if args.engine:
        out["engine"] = engine(adapter, label, cfg, args.requests, device, peak)
    del adapter
    gc.collect()
    torch.cuda.empty_cache()
    return out


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu.attention", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default="flash,cudnn,efficient")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--engine", action="store_true", help="also the step-wise engine per backend")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--variants", default="plain", help="comma-separated: plain or +-joined frozen, lora, gelu (see per_backend)")
    p.add_argument("--ffn", action="store_true", help="also the feed-forward GEMM + GELU alone, fused and not")
    p.add_argument("--mode", default=None, help="torch.compile mode of the blocks (default: torch's default)")
    p.add_argument("--key", default="attention", help="results key (default: %(default)s)")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args()
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    device = torch.device("cuda")
    cfg = TINY if args.tiny else SD35_MEDIUM
    backends = args.backends.split(",")
    peak = matmul_peak_tflops(device)
    gpu = torch.cuda.get_device_name(device)
    print(f"{gpu}: bf16 matmul peak {peak:.1f} TFLOP/s", flush=True)
    variants = args.variants.split(",")
    res = {"peak_tflops": peak, "batch": args.batch, "mode": args.mode, "kernels": kernels(backends, args.batch, device, peak)}
    if args.ffn:
        res["ffn"] = ffn_kernels(args.batch, device)
    res["backends"] = {b if v == "plain" else f"{b}/{v}": per_backend(b, cfg, args, device, peak, v)
                       for b in backends for v in variants}
    path = results_path(args.out, gpu, args.tiny)
    merge_results(path, args.key, res)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
