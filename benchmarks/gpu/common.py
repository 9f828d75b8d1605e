"""Timing, peak-FLOP and compile-counter helpers shared by the GPU benchmarks."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

import torch

from benchmarks.gpu.flops import sd3_forward_flops
from benchmarks.gpu.model import TEXT_TOKENS


def sync(device: torch.device) -> None:
    """Wait for the device (no-op on the CPU) so wall-clock timings cover the queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> tuple[object, float]:
    """Run `fn` and return (its result, seconds), device work included."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def matmul_peak_tflops(device: torch.device, n: int = 8192, repeats: int = 20) -> float:
    """Measured bf16 matmul throughput (TFLOP/s) of an n³ product: the MFU denominator."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    _, seconds = timed(lambda: [a @ b for _ in range(repeats)], device)
    return 2 * n**3 * repeats / seconds / 1e12


def compiled_graphs() -> int:
    """Graphs dynamo has compiled so far in this process (grows on every (re)compile)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def request_flops(config: dict, latent_shape: tuple[int, ...], num_steps: int, cfg_rows: int = 1) -> float:
    """Denoiser FLOPs to generate one sample: num_steps forwards of its latent size."""
    return num_steps * cfg_rows * sd3_forward_flops(config, tuple(latent_shape[-2:]), TEXT_TOKENS)


def mfu(flops: float, seconds: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over the measured matmul peak."""
    return flops / seconds / (peak_tflops * 1e12)


def results_path(out: str | Path, device_name: str, tiny: bool = False) -> Path:
    """`<out>/<today>-<device slug>[-tiny].json`, the file a day's results on one machine merge into
    (e.g. `benchmarks/results/2026-12-02-nvidia-h200.json`)."""
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") + ("-tiny" if tiny else "")
    return Path(out) / f"{date.today()}-{slug}.json"


def merge_results(path: Path, key: str, value: dict) -> None:
    """Set `key` to `value` in the JSON results file at `path` (created if missing), keeping its other keys."""
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=float))
