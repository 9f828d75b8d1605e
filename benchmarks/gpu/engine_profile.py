"""Where the step-wise engine loses time against its own forward: GPU idle, host syncs, extra kernels.

    python -m benchmarks.gpu.engine_profile [--requests 64] [--out DIR]

The rollout engine reaches a few points less MFU than the compiled forward it runs (58% against
61% at batch 32 on an H200). This benchmark runs the product's rollout module (frozen, compiled,
attention `auto`) and reports, for the uniform workload (512², 10 steps, batch 32):
- `forward`: the compiled forward alone at batch 32 (ms, MFU);
- `engine`: the step-wise engine, burst and stream arrival (images/s, MFU);
- `profile`: one engine run under the profiler (CPU and CUDA): wall time, the time the GPU had
  no kernel running (`gpu_idle_ms`: the union of kernel intervals subtracted from the wall), CUDA
  kernel time by kind, the ten largest kernels outside the forward's kinds, the host calls
  that waited for the device (`cudaStreamSynchronize`, `cudaMemcpy*` over 0.5 ms), and where the
  host was while the GPU idled (`idle_by_host_range`: each idle gap charged to the innermost
  engine or adapter method running at its midpoint, `outside` when none: the benchmark's loop).

`--graphs` (an experiment, not the product): the adapter's `velocity` replays one captured CUDA
graph per input shape (static input buffers, one shared memory pool), to measure what launch
gaps cost the engine.

Results merge into `benchmarks/results/<date>-<gpu>.json` under `--key` (default `engine_profile`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
from collections import defaultdict

import torch

from benchmarks.gpu import rollout
from benchmarks.gpu.attention import cuda_ms, kernel_kind
from benchmarks.gpu.common import matmul_peak_tflops, merge_results, mfu, results_path, sync
from benchmarks.gpu.flops import sd3_forward_flops
from benchmarks.gpu.model import SD35_MEDIUM, TEXT_TOKENS, TINY, BenchSD3Adapter, build_transformer
from omnirl.models.compile import compile_adapter_module
from omnirl.rollout.engine import RolloutEngine

ENGINE_RANGES = ("step", "_admit", "_pick_batch", "_advance", "_finish_group")
ADAPTER_RANGES = ("encode", "velocity", "decode")


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    """Total length (ms) of the union of `(start_us, end_us)` intervals."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total / 1e3


@contextlib.contextmanager
def _host_ranges(adapter):
    """Profiler ranges named `engine.<method>` / `adapter.<method>` around the engine's and the
    adapter's methods (patched for the duration; restored after)."""
    from torch.profiler import record_function

    def wrap(fn, label):
        @functools.wraps(fn)
        def inner(*a, **kw):
            with record_function(label):
                return fn(*a, **kw)
        return inner

    saved = [(RolloutEngine, n, getattr(RolloutEngine, n)) for n in ENGINE_RANGES]
    for _, n, fn in saved:
        setattr(RolloutEngine, n, wrap(fn, f"engine.{n}"))
    own = {n: adapter.__dict__[n] for n in ADAPTER_RANGES if n in adapter.__dict__}  # e.g. GraphedVelocity
    for n in ADAPTER_RANGES:
        setattr(adapter, n, wrap(getattr(adapter, n), f"adapter.{n}"))
    try:
        yield
    finally:
        for cls, n, fn in saved:
            setattr(cls, n, fn)
        for n in ADAPTER_RANGES:
            delattr(adapter, n)  # the wrapper hid the class's method (or the instance's own)
        adapter.__dict__.update(own)


def _idle_by_range(kernels: list[tuple[float, float]], ranges: list[tuple[float, float, str]],
                   start: float, end: float) -> dict[str, dict]:
    """Idle gaps of the GPU between `start` and `end` (µs) charged to the innermost host range
    holding each gap's midpoint: `{label: {"gaps": n, "ms": total}}`, largest first."""
    gaps, last = [], start
    for s, e in sorted(kernels):
        if s > last:
            gaps.append((last, s))
        last = max(last, e)
    if end > last:
        gaps.append((last, end))
    out: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for a, b in gaps:
        mid = (a + b) / 2
        holding = [(e - s, label) for s, e, label in ranges if s <= mid <= e]
        label = min(holding)[1] if holding else "outside"
        out[label][0] += 1
        out[label][1] += (b - a) / 1e3
    return {k: {"gaps": n, "ms": ms} for k, (n, ms) in sorted(out.items(), key=lambda kv: -kv[1][1])}


class GraphedVelocity:
    """`adapter.velocity` replayed from one CUDA graph per input shape (experiment, CUDA only).

    The first call at a shape warms up on a side stream (compilation, autotuning), then captures
    into a memory pool shared by every graph (one replays at a time); later calls copy the inputs
    into the graph's static buffers, replay, and return a copy of the output `[B, C, H, W]` float32.
    """

    def __init__(self, adapter) -> None:
        self.velocity = adapter.velocity
        self.graphs: dict[tuple, tuple] = {}
        self.pool = torch.cuda.graph_pool_handle()

    def __call__(self, x, sigma, cond):
        key = (tuple(x.shape), tuple(sigma.shape), tuple((k, tuple(v.shape)) for k, v in sorted(cond.items())))
        if key not in self.graphs:
            static = (x.clone(), sigma.clone(), {k: v.clone() for k, v in cond.items()})
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self.velocity(*static)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = self.velocity(*static)
            self.graphs[key] = (graph, static, out)
        graph, (sx, ssigma, scond), out = self.graphs[key]
        sx.copy_(x)
        ssigma.copy_(sigma)
        for k, v in cond.items():
            scond[k].copy_(v)
        graph.replay()
        return out.clone()


def profile_engine(adapter, requests: int, arrival: str, device, cfg: dict, peak: float) -> dict:
    """One engine run under the profiler: wall, GPU busy/idle, kernels by kind, host waits, and
    the host ranges the idle time fell in."""
    from torch.profiler import ProfilerActivity, profile

    reqs = rollout.requests(adapter, requests, False, 5)
    with _host_ranges(adapter), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        row = rollout.run_engine(adapter, reqs, "stepwise", 32, arrival, device, peak, cfg)
    events = prof.events()
    ranges = [(e.time_range.start, e.time_range.end, e.name) for e in events
              if e.name.startswith(("engine.", "adapter.")) and not str(getattr(e, "device_type", "")).endswith("CUDA")]
    kernels, waits = [], defaultdict(lambda: [0, 0.0])
    by_kind: dict[str, float] = defaultdict(float)
    names: dict[str, float] = defaultdict(float)
    for e in events:
        dev_type = str(getattr(e, "device_type", ""))
        if e.name.startswith(("engine.", "adapter.")):
            continue  # our ranges, on the host and mirrored on the GPU's timeline (not kernels)
        if dev_type.endswith("CUDA") and e.time_range.elapsed_us() > 0:
            kernels.append((e.time_range.start, e.time_range.end))
            kind = kernel_kind(e.name)
            by_kind[kind] += e.time_range.elapsed_us() / 1e3
            if kind == "other":
                names[e.name[:110]] += e.time_range.elapsed_us() / 1e3
        elif e.name in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize") or (
                e.name.startswith("cudaMemcpy") and e.time_range.elapsed_us() > 500):
            waits[e.name][0] += 1
            waits[e.name][1] += e.time_range.elapsed_us() / 1e3
    wall_ms = row["seconds"] * 1e3
    busy = _union_ms(kernels)
    steps = [r for r in ranges if r[2] == "engine.step"]
    idle = _idle_by_range(kernels, ranges, steps[0][0], steps[-1][1]) if steps else {}
    out = {**row, "wall_ms": wall_ms, "gpu_busy_ms": busy, "gpu_idle_ms": wall_ms - busy,
           "kernel_ms": dict(by_kind), "largest_other": sorted(names.items(), key=lambda kv: -kv[1])[:12],
           "host_waits": {k: {"calls": n, "ms": ms} for k, (n, ms) in waits.items()},
           "idle_by_host_range": idle}
    print(f"  profile {arrival}: {row['images_per_second']:.2f} img/s (profiled) wall {wall_ms:.0f} ms, GPU busy "
          f"{busy:.0f} ms, idle {wall_ms - busy:.0f} ms ({(wall_ms - busy) / wall_ms:.1%}); kernels "
          + ", ".join(f"{k} {v:.0f} ms" for k, v in sorted(by_kind.items())), flush=True)
    for k, v in out["host_waits"].items():
        print(f"      host wait {k}: {v['calls']} calls, {v['ms']:.1f} ms", flush=True)
    for k, v in idle.items():
        print(f"      GPU idle in {k}: {v['gaps']} gaps, {v['ms']:.1f} ms", flush=True)
    for k, v in out["largest_other"]:
        print(f"      {v:7.2f} ms  {k}", flush=True)
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu.engine_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=64, help="requests in the profiled run (default %(default)s)")
    p.add_argument("--engine-requests", type=int, default=256, help="requests in the timed runs")
    p.add_argument("--tiny", action="store_true", help="small configuration (CPU smoke test)")
    p.add_argument("--graphs", action="store_true", help="experiment: velocity replayed from a CUDA graph per shape")
    p.add_argument("--key", default="engine_profile")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = TINY if args.tiny else SD35_MEDIUM
    peak = matmul_peak_tflops(device) if device.type == "cuda" else 1.0
    adapter = BenchSD3Adapter(build_transformer(cfg, device), attention="auto")
    adapter.module.requires_grad_(False)  # as `prepare_rollout_module` leaves a rollout worker
    compile_adapter_module(adapter)
    if args.graphs:
        adapter.velocity = GraphedVelocity(adapter)
    side = 8 * cfg["sample_size"] // 2 if args.tiny else 512
    inputs = {"hidden_states": torch.randn(32, 16, side // 8, side // 8, device=device, dtype=torch.bfloat16),
              "encoder_hidden_states": torch.randn(32, TEXT_TOKENS, cfg["joint_attention_dim"], device=device,
                                                   dtype=torch.bfloat16),
              "pooled_projections": torch.randn(32, cfg["pooled_projection_dim"], device=device, dtype=torch.bfloat16),
              "timestep": torch.full((32,), 500.0, device=device)}
    report: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "matmul_peak_tflops": peak, "graphs": args.graphs}
    with torch.no_grad():
        rollout.run_engine(adapter, rollout.requests(adapter, 64, False, 9), "stepwise", 32, "burst", device, peak, cfg)
        run = lambda: adapter.module(**inputs, return_dict=False)[0]  # noqa: E731
        ms = cuda_ms(run, 10) if device.type == "cuda" else 0.0
        flops = 32 * sd3_forward_flops(cfg, (side // 8, side // 8), TEXT_TOKENS)
        report["forward"] = {"ms": ms, "mfu": mfu(flops, ms / 1e3, peak) if ms else None}
        print(f"  forward batch 32: {ms:.1f} ms MFU {report['forward']['mfu'] or 0:.1%}", flush=True)
        for arrival in ("burst", "stream"):
            row = rollout.run_engine(adapter, rollout.requests(adapter, args.engine_requests, False, 2), "stepwise",
                                     32, arrival, device, peak, cfg)
            report[f"engine_{arrival}"] = row
            print(f"  engine {arrival}: {row['images_per_second']:.2f} img/s MFU {row['mfu']:.1%} "
                  f"mean batch {row['mean_batch']:.1f}", flush=True)
        sync(device)
        for arrival in ("burst", "stream"):
            report[f"profile_{arrival}"] = profile_engine(adapter, args.requests, arrival, device, cfg, peak)
    path = results_path(args.out, report["device"], args.tiny)
    merge_results(path, args.key, report)
    print(f"wrote {path}")
    return report


if __name__ == "__main__":
    main()
