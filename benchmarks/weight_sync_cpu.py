"""Weight-sync timings on CPU/gloo: a full 2M-parameter sync and a LoRA-only sync, 1 and 2 receivers.

Run: ``.venv/bin/python -m benchmarks.weight_sync_cpu [--repeats 5] [--bucket-mb 64]``

Every receiver is its own spawned process (``torch.set_num_threads(1)``) on loopback. Printed per
case: median seconds of `WeightSender.broadcast` (announce → last ack, including the manifest's
checksums on the sender and the receivers' arrival + post-copy checks), payload MB, buckets, and
the one-off group build (first sync) versus a cached group. Also the in-process cost of
`tensor_checksum` and `build_manifest` on the 2M-parameter state.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time

import torch
from torch import nn

from omnirl.weight_sync import WeightReceiver, WeightSender, named_trainable_tensors, tensor_checksum
from omnirl.weight_sync.manifest import build_manifest

WIDTH = 1000  # two Linear(1000, 1000) layers: 2,002,000 parameters
LORA_RANK = 16


def _full_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))


def _lora_model() -> nn.Module:
    from peft import LoraConfig, inject_adapter_in_model

    module = _full_model()
    inject_adapter_in_model(LoraConfig(r=LORA_RANK, lora_alpha=LORA_RANK, target_modules=["0", "2"]), module)
    return module


def _receiver(port: int, worker_id: str, cmd_q: mp.Queue, res_q: mp.Queue) -> None:
    torch.set_num_threads(1)
    models = {"full": _full_model(), "lora": _lora_model()}
    rx = WeightReceiver("127.0.0.1", port, worker_id, timeout_s=120)
    res_q.put("ready")
    while (kind := cmd_q.get()) != "stop":
        report = rx.receive(models[kind])
        res_q.put(json.dumps({"tensors": report.tensors_updated}))
    rx.close()


def _case(sender: WeightSender, queues: list[tuple[mp.Queue, mp.Queue]], kind: str, named: dict,
          repeats: int, version: int) -> dict:
    seconds, group = [], []
    for r in range(repeats):
        for cmd_q, _ in queues:
            cmd_q.put(kind)
        report = sender.broadcast(named, version + r)
        for _, res_q in queues:
            json.loads(res_q.get(timeout=120))
        seconds.append(report.seconds)
        group.append(report.group_seconds)
    return {"kind": kind, "receivers": len(queues), "median_s": statistics.median(seconds),
            "min_s": min(seconds), "mb": report.bytes / 2**20, "buckets": report.buckets,
            "first_group_build_s": group[0], "cached_group_s": max(group[1:], default=0.0)}


def _run(n_receivers: int, repeats: int, bucket_mb: float, full: dict, lora: dict) -> list[dict]:
    sender = WeightSender("127.0.0.1", 0, bucket_mb=bucket_mb, timeout_s=120)
    ctx = mp.get_context("spawn")
    procs, queues = [], []
    for i in range(n_receivers):
        cmd_q, res_q = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=_receiver, args=(sender.port, f"bench{i}", cmd_q, res_q), daemon=True)
        p.start()
        procs.append(p)
        queues.append((cmd_q, res_q))
    try:
        for _, res_q in queues:
            assert res_q.get(timeout=300) == "ready"
        while len(sender.members()) < n_receivers:
            time.sleep(0.01)
        return [_case(sender, queues, "full", full, repeats, 100),
                _case(sender, queues, "lora", lora, repeats, 200)]
    finally:
        for cmd_q, _ in queues:
            cmd_q.put("stop")
        for p in procs:
            p.join(timeout=30)
        sender.close()


def _local_costs(full: dict) -> dict:
    t0 = time.perf_counter()
    for t in full.values():
        tensor_checksum(t)
    t1 = time.perf_counter()
    build_manifest(full, 0, 64 * 2**20)
    return {"checksum_2m_params_s": t1 - t0, "build_manifest_s": time.perf_counter() - t1}


def main() -> None:
    """Print one table row per case and a JSON summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bucket-mb", type=float, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    full = named_trainable_tensors(_full_model(), adapters_only=False)
    lora_module = _lora_model()
    with torch.no_grad():
        for name, p in lora_module.named_parameters():
            if "lora_B" in name:
                p.normal_()
    lora = named_trainable_tensors(lora_module, adapters_only=True)
    n_full, n_lora = sum(t.numel() for t in full.values()), sum(t.numel() for t in lora.values())
    print(f"full: {n_full:,} params ({n_full * 4 / 2**20:.2f} MiB fp32); lora r={LORA_RANK}: {n_lora:,} params")
    rows = [row for n in (1, 2) for row in _run(n, args.repeats, args.bucket_mb, full, lora)]
    print(f"{'case':<6}{'recv':>5}{'median s':>10}{'min s':>9}{'MiB':>7}{'buckets':>8}{'group build s':>15}"
          f"{'cached s':>10}")
    for r in rows:
        print(f"{r['kind']:<6}{r['receivers']:>5}{r['median_s']:>10.4f}{r['min_s']:>9.4f}{r['mb']:>7.2f}"
              f"{r['buckets']:>8}{r['first_group_build_s']:>15.4f}{r['cached_group_s']:>10.4f}")
    local = _local_costs(full)
    print(f"in-process: tensor_checksum over 2M params {local['checksum_2m_params_s']:.4f} s, "
          f"build_manifest {local['build_manifest_s']:.4f} s")
    print(json.dumps({"rows": rows, **local}))


if __name__ == "__main__":
    main()
