"""Actor → rollout weight sync of the SD3.5-Medium-sized transformer: LoRA adapters and full weights.

Run: ``python -m benchmarks.gpu.weight_sync [--tiny] [--device cuda|cpu] [--repeats 3] [--lora-rank 32]``

What is timed is the real path of docs/architecture.md §2 step 5: `WeightSender.broadcast` in this process
(the actor, module from `build_transformer(config, device, bfloat16)`) to ONE `WeightReceiver` in a
spawned child process (the rollout worker, its own copy of the module). One sync = announce the
manifest (with its per-tensor checksums) → group → buckets → the receiver binds by name, verifies
the checksums on arrival and after the copy → ack; `SyncReport.seconds` spans announce → last ack.

Cases, in this order (the group built by the first sync is reused by all later ones):

- ``full``: the whole state_dict of the plain module (SD3.5-Medium: 2.24 B bf16 values, ~4.5 GB).
- ``lora``: then both sides inject peft LoRA r=`lora_rank` (alpha = 2·rank) on `SD3_LORA_TARGETS`
  with `omnirl.models.lora.inject_lora`, and only `lora_tensors(module)` travel (what
  `PolicySet.rollout_tensors` sends).

Each case runs one untimed-in-the-median first sync (reported as ``first_sync_s``, with the group
build ``group_build_s`` inside it; non-zero only for the very first sync), then `repeats` timed
syncs. Before every sync the actor negates its tensors in place, so each version carries new
values and a receiver that missed one would not match.

Placement: on one GPU the two processes share it, and NCCL refuses two ranks on one device, so
the backend is cuda-ipc (device-to-device through CUDA IPC handles, what `omnirl run --share-gpus`
uses) or, with ``--backend gloo``, gloo (buckets staged in host memory); with ≥ 2 GPUs it is nccl
with the receiver on the next GPU. On CPU it is gloo; the child runs with one torch thread.
MB here are 10^6 bytes. A failing receiver raises `RolloutChildError` carrying the child's
traceback; every wait is bounded by ``timeout_s``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import queue as queue_mod
import statistics
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from benchmarks.gpu.model import SD35_MEDIUM, TINY, build_transformer
from omnirl.api.spec import LoRASpec
from omnirl.models.diffusers.sd3 import SD3_LORA_TARGETS
from omnirl.models.lora import inject_lora, lora_tensors
from omnirl.weight_sync import SyncReport, WeightReceiver, WeightSender, WeightSyncError, named_trainable_tensors

MB = 1e6
WORKER_ID = "bench-rollout-0"
CASES = ("full", "lora")


class RolloutChildError(RuntimeError):
    """The rollout child process failed, died, or did not answer in time; the message carries its traceback."""


@dataclass(frozen=True)
class Placement:
    """Where each side runs and how buckets travel.

    Attributes:
        backend: ``gloo`` or ``nccl``.
        actor_device: the sender's device (``cpu``, ``cuda:0``).
        rollout_device: the receiver's device (the same GPU under gloo, another GPU under nccl).
    """

    backend: str
    actor_device: str
    rollout_device: str


def plan_placement(device: str, backend: str | None = None) -> Placement:
    """Choose backend and devices: cpu → gloo; one GPU → cuda-ipc on that GPU; ≥ 2 GPUs → nccl, receiver on the next GPU.

    Raises:
        ValueError: a device that is neither cpu nor cuda, cuda without a GPU, a backend other than
            gloo/nccl, or nccl with fewer than 2 GPUs (NCCL refuses two ranks on one GPU; pass
            ``backend='gloo'`` or None).
    """
    dev = torch.device(device)
    if backend not in (None, "gloo", "nccl", "cuda-ipc"):
        raise ValueError(f"backend={backend!r}: expected 'gloo', 'nccl', 'cuda-ipc' or None (chosen by the device)")
    if dev.type == "cpu":
        if backend in ("nccl", "cuda-ipc"):
            raise ValueError(f"backend={backend!r} needs device='cuda'; on CPU use backend='gloo' or None")
        return Placement("gloo", "cpu", "cpu")
    if dev.type != "cuda":
        raise ValueError(f"device={device!r}: expected 'cpu' or 'cuda[:i]'")
    count = torch.cuda.device_count()
    if count == 0:
        raise ValueError(f"device={device!r} but torch sees no CUDA GPU; pass device='cpu'")
    index = dev.index or 0
    chosen = backend or ("nccl" if count >= 2 else "cuda-ipc")
    if chosen == "nccl" and count < 2:
        raise ValueError("backend='nccl' needs 2 GPUs (NCCL refuses two ranks on one GPU); pass backend='gloo' or None")
    rollout = f"cuda:{(index + 1) % count}" if chosen == "nccl" else f"cuda:{index}"
    return Placement(chosen, f"cuda:{index}", rollout)


def case_tensors(module: torch.nn.Module, case: str) -> dict[str, torch.Tensor]:
    """What the actor sends for `case` (name → detached tensor sharing the module's storage).

    ``full``: the whole state_dict (`named_trainable_tensors(module, adapters_only=False)`);
    ``lora``: `lora_tensors(module)` (peft names with the adapter ``default``).

    Raises:
        ValueError: an unknown case, or ``lora`` on a module without LoRA.
    """
    if case == "full":
        return named_trainable_tensors(module, adapters_only=False)
    if case == "lora":
        named = {k: v.detach() for k, v in lora_tensors(module).items()}
        if not named:
            raise ValueError("case 'lora': the module has no LoRA tensors; inject LoRA first")
        return named
    raise ValueError(f"case={case!r}: expected one of {CASES}")


def _lora_spec(rank: int) -> LoRASpec:
    return LoRASpec(enabled=True, rank=rank, alpha=2.0 * rank)


def _dump(named: dict[str, torch.Tensor], path: Path) -> None:
    save_file({k: v.detach().to("cpu").contiguous().clone() for k, v in named.items()}, str(path))


# ---------------------------------------------------------------------------------------- child side

def _rollout_worker(spec: dict, cmd_q: mp.Queue, res_q: mp.Queue) -> None:
    """Child entry point: build the module, register a receiver, then serve JSON commands until ``stop``."""
    try:
        if spec["device"] == "cpu":
            torch.set_num_threads(1)
        module = build_transformer(spec["config"], spec["device"], torch.bfloat16, seed=1)  # unlike the actor's
        rx = WeightReceiver("127.0.0.1", spec["port"], WORKER_ID, backend=spec["backend"], device=spec["device"],
                            timeout_s=spec["timeout_s"])
        res_q.put(json.dumps({"ready": True, "backend": rx.backend, "transport": str(rx.transport)}))
        while (cmd := json.loads(cmd_q.get()))["op"] != "stop":
            if cmd["op"] == "receive":
                report = rx.receive(module)
                reply = {"tensors": report.tensors_updated, "modules": report.modules_updated}
            elif cmd["op"] == "inject_lora":
                inject_lora(module, _lora_spec(spec["lora_rank"]), list(SD3_LORA_TARGETS))
                reply = {"lora_tensors": len(lora_tensors(module))}
            elif cmd["op"] == "dump":
                _dump(case_tensors(module, cmd["case"]), Path(cmd["path"]))
                reply = {}
            else:
                raise ValueError(f"unknown command {cmd!r}")
            res_q.put(json.dumps(reply))
        rx.close()
    except BaseException:  # reported to the parent, which raises it as RolloutChildError
        res_q.put(json.dumps({"error": traceback.format_exc()}))


class RolloutChild:
    """The spawned rollout process (`_rollout_worker`) and its two queues (JSON strings only, no pickle of ours).

    Args:
        spec: ``config`` (model config), ``device``, ``port`` (the sender's store), ``backend``,
            ``lora_rank``, ``timeout_s`` — plain JSON values.
    """

    def __init__(self, spec: dict) -> None:
        ctx = mp.get_context("spawn")
        self.cmd_q, self.res_q = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=_rollout_worker, args=(spec, self.cmd_q, self.res_q), daemon=True)
        self.proc.start()

    def reply(self, timeout_s: float) -> dict:
        """The child's next reply; raises `RolloutChildError` on its error, its death or `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                doc = json.loads(self.res_q.get(timeout=0.2))
                break
            except queue_mod.Empty:
                if not self.proc.is_alive():
                    raise RolloutChildError(f"rollout child exited with code {self.proc.exitcode} "
                                            "without a reply") from None
                if time.monotonic() > deadline:
                    raise RolloutChildError(f"rollout child did not reply within {timeout_s:.0f} s") from None
        if "error" in doc:
            raise RolloutChildError(f"rollout child failed:\n{doc['error']}")
        return doc

    def call(self, cmd: dict, timeout_s: float) -> dict:
        """Send `cmd` and return the reply (errors as `reply`)."""
        self.cmd_q.put(json.dumps(cmd))
        return self.reply(timeout_s)

    def stop(self) -> None:
        """Ask the child to stop; kill it when it has not exited within 30 s."""
        if self.proc.is_alive():
            self.cmd_q.put(json.dumps({"op": "stop"}))
            self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=10)


# --------------------------------------------------------------------------------------- actor side

def _sync_once(sender: WeightSender, child: RolloutChild, named: dict[str, torch.Tensor], version: int) -> SyncReport:
    """New values (negate in place), then one broadcast → receive; raises the child's error if it failed."""
    with torch.no_grad():
        for t in named.values():
            if t.is_floating_point():
                t.neg_()
    child.cmd_q.put(json.dumps({"op": "receive"}))
    try:
        report = sender.broadcast(named, version)
    except WeightSyncError as err:
        try:
            child.reply(timeout_s=10)
        except RolloutChildError as child_err:
            raise RolloutChildError(f"weight sync v{version} failed ({err}); {child_err}") from err
        raise
    child.reply(sender.timeout_s)
    return report


def _run_case(sender: WeightSender, child: RolloutChild, case: str, named: dict[str, torch.Tensor], repeats: int,
              version: int, dump_dir: Path | None) -> dict:
    """One warm-up (first) sync plus `repeats` timed syncs of `named`; returns the case's row."""
    if dump_dir is not None:
        child.call({"op": "dump", "case": case, "path": str(dump_dir / f"{case}_rollout_before.safetensors")},
                   sender.timeout_s)
    first = _sync_once(sender, child, named, version)
    reports = [_sync_once(sender, child, named, version + 1 + r) for r in range(repeats)]
    if dump_dir is not None:
        _dump(named, dump_dir / f"{case}_actor.safetensors")
        child.call({"op": "dump", "case": case, "path": str(dump_dir / f"{case}_rollout.safetensors")},
                   sender.timeout_s)
    seconds = [r.seconds for r in reports]
    median = statistics.median(seconds)
    return {"case": case, "median_s": median, "seconds": seconds, "payload_mb": first.bytes / MB,
            "tensors": len(named), "buckets": first.buckets, "first_sync_s": first.seconds,
            "group_build_s": first.group_seconds, "gb_per_s": first.bytes / 1e9 / median if median > 0 else 0.0}


def measure_weight_sync(config: dict, device: str, *, lora_rank: int = 32, repeats: int = 3,
                        backend: str | None = None, bucket_mb: float = 64.0, timeout_s: float = 300.0,
                        dump_dir: str | Path | None = None) -> dict:
    """Time `WeightSender.broadcast` → `WeightReceiver.receive` to one spawned rollout process.

    Args:
        config: `SD3Transformer2DModel` config (`SD35_MEDIUM`, `TINY`).
        device: the actor's device, ``"cpu"`` or ``"cuda[:i]"`` (see `plan_placement`).
        lora_rank: LoRA rank r (alpha = 2·r) for the ``lora`` case.
        repeats: timed syncs per case (≥ 1), after one first sync each.
        backend: None (by placement), ``"gloo"`` or ``"nccl"``.
        bucket_mb: `WeightSender` bucket capacity in MiB.
        timeout_s: bound (s) on each sync phase, on the child's start-up and on each reply.
        dump_dir: when set, write ``{case}_actor``, ``{case}_rollout_before`` and ``{case}_rollout``
            ``.safetensors`` (the sent tensors, and the receiver's tensors of the same names before
            the first and after the last sync) — for tests; leave None for SD3.5 (4.5 GB each).

    Returns:
        ``backend``, ``transport``, ``actor_device``, ``rollout_device``, ``lora_rank``;
        ``{full,lora}_sync_seconds`` (median, s), ``{full,lora}_payload_mb`` (10^6 bytes),
        ``{full,lora}_sync_seconds_all`` (per repeat, s); ``cases`` (one row per case: median_s,
        seconds, payload_mb, tensors, buckets, first_sync_s, group_build_s, gb_per_s).

    Raises:
        ValueError: bad repeats/lora_rank, or see `plan_placement`.
        RolloutChildError: the receiver failed (its traceback), died or did not answer in time.
        WeightSyncError: the sync failed on the actor's side while the child reported nothing.
    """
    if repeats < 1 or lora_rank < 1:
        raise ValueError(f"repeats ({repeats}) and lora_rank ({lora_rank}) must be >= 1")
    place = plan_placement(device, backend)
    dump = None if dump_dir is None else Path(dump_dir)
    module = build_transformer(config, place.actor_device, torch.bfloat16, seed=0)
    sender = WeightSender("127.0.0.1", 0, backend=place.backend, device=place.actor_device, bucket_mb=bucket_mb,
                          timeout_s=timeout_s)
    child = RolloutChild({"config": config, "device": place.rollout_device, "port": sender.port, "backend": place.backend,
                    "lora_rank": lora_rank, "timeout_s": timeout_s})
    try:
        info = child.reply(timeout_s)
        _wait_member(sender, timeout_s)
        full = _run_case(sender, child, "full", case_tensors(module, "full"), repeats, 1, dump)
        inject_lora(module, _lora_spec(lora_rank), list(SD3_LORA_TARGETS))
        child.call({"op": "inject_lora"}, timeout_s)
        lora = case_tensors(module, "lora")
        gen = torch.Generator(device=place.actor_device).manual_seed(0)
        with torch.no_grad():  # lora_B starts at zero: give it values so the adapters differ from the receiver's
            for name, t in lora.items():
                if "lora_B" in name:
                    t.normal_(generator=gen)
        lora_row = _run_case(sender, child, "lora", lora, repeats, 2 + repeats, dump)
    finally:
        child.stop()
        sender.close()
    return {"backend": sender.backend, "transport": str(sender.transport), "rollout_transport": info["transport"],
            "actor_device": place.actor_device, "rollout_device": place.rollout_device, "lora_rank": lora_rank,
            "full_sync_seconds": full["median_s"], "lora_sync_seconds": lora_row["median_s"],
            "full_payload_mb": full["payload_mb"], "lora_payload_mb": lora_row["payload_mb"],
            "full_sync_seconds_all": full["seconds"], "lora_sync_seconds_all": lora_row["seconds"],
            "cases": [full, lora_row]}


def _wait_member(sender: WeightSender, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while WORKER_ID not in sender.members():
        if time.monotonic() > deadline:
            raise RolloutChildError(f"rollout child did not register within {timeout_s:.0f} s")
        time.sleep(0.01)


def main() -> None:
    """Print one table row per case and the summary as one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="the TINY config (CPU-sized) instead of SD3.5-Medium")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backend", choices=["gloo", "nccl", "cuda-ipc"], default=None)
    parser.add_argument("--lora-rank", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bucket-mb", type=float, default=64.0)
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    out = measure_weight_sync(TINY if args.tiny else SD35_MEDIUM, args.device, lora_rank=args.lora_rank,
                              repeats=args.repeats, backend=args.backend, bucket_mb=args.bucket_mb,
                              timeout_s=args.timeout_s)
    print(f"backend {out['backend']} (actor {out['actor_device']} → rollout {out['rollout_device']}, "
          f"transport {out['transport']}/{out['rollout_transport']}), LoRA r={out['lora_rank']}")
    print(f"{'case':<6}{'median s':>11}{'MB':>11}{'GB/s':>8}{'tensors':>9}{'buckets':>9}{'first s':>10}"
          f"{'group s':>10}")
    for r in out["cases"]:
        print(f"{r['case']:<6}{r['median_s']:>11.4f}{r['payload_mb']:>11.2f}{r['gb_per_s']:>8.2f}{r['tensors']:>9}"
              f"{r['buckets']:>9}{r['first_sync_s']:>10.4f}{r['group_build_s']:>10.4f}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
