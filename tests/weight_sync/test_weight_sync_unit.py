"""Weight sync pieces in one process: checksum, manifest/buckets, binding verification, backend choice."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections import OrderedDict

import pytest
import torch
from torch import nn

from omnirl.weight_sync import (
    BindingError,
    BindReport,
    Manifest,
    SyncAborted,
    WeightReceiver,
    WeightSender,
    WeightSyncError,
    apply_to_module,
    named_trainable_tensors,
    tensor_checksum,
)
from omnirl.weight_sync import receiver as receiver_module
from omnirl.weight_sync.groups import resolve_backend
from omnirl.weight_sync.manifest import build_manifest, empty_bucket, pack_bucket, unpack_bucket


def _mlp(names: tuple[str, str] = ("qkv", "proj"), seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(OrderedDict([(names[0], nn.Linear(8, 16)), ("act", nn.ReLU()), (names[1], nn.Linear(16, 4))]))


# -- tensor_checksum -----------------------------------------------------------------------------------

def test_checksum_matches_hand_computed_sums() -> None:
    # words u = [1, 2] at j = [0, 1]; weights 1 + (j*40503 mod 32749) = [1, 7755], 1 + (j*48271 mod 32719) = [1, 15553]
    assert tensor_checksum(torch.tensor([1, 2], dtype=torch.int16)) == f"{1 + 2 * 7755:016x}{1 + 2 * 15553:016x}"
    # -1 as int16 is the word 0xFFFF = 65535; one byte-sized word for uint8
    assert tensor_checksum(torch.tensor([-1], dtype=torch.int16)) == f"{65535:016x}{65535:016x}"
    assert tensor_checksum(torch.tensor([7], dtype=torch.uint8)) == f"{7:016x}{7:016x}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64,
                                   torch.uint8, torch.bool])
def test_checksum_detects_a_single_bit_flip_and_a_swap(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    t = (torch.randn(5, 7) * 10).to(dtype) if dtype != torch.bool else torch.rand(5, 7) > 0.5
    base = tensor_checksum(t)
    assert tensor_checksum(t.clone()) == base and len(base) == 32
    flipped = t.clone()
    raw = flipped.view(-1).view(torch.uint8)
    raw[3] ^= 1  # lowest bit of one byte
    assert tensor_checksum(flipped) != base
    swapped = t.clone().view(-1)
    i, j = 0, 1
    while torch.equal(swapped[i], swapped[j]):
        j += 1
    swapped[[i, j]] = swapped[[j, i]]
    assert tensor_checksum(swapped) != base


def test_checksum_of_a_non_contiguous_view_equals_its_contiguous_copy() -> None:
    t = torch.arange(12, dtype=torch.float32).view(3, 4).t()
    assert tensor_checksum(t) == tensor_checksum(t.contiguous())
    assert tensor_checksum(t) != tensor_checksum(t.t())  # other byte order


# -- manifest and buckets ------------------------------------------------------------------------------

def test_buckets_hold_one_dtype_respect_the_cap_and_round_trip_exactly() -> None:
    named = {"a": torch.randn(10), "b": torch.randn(3, 4), "h": torch.randn(5).half(), "c": torch.randn(100),
             "d": torch.randn(2)}
    m = build_manifest(named, version=7, bucket_bytes=64)  # 16 fp32 elements
    by_bucket = [[e.name for e in m.tensors if e.bucket == i] for i in range(len(m.buckets))]
    assert by_bucket == [["a"], ["b"], ["c"], ["d"], ["h"]]  # a+b = 88 B > 64; c (400 B) alone
    assert [b.nbytes for b in m.buckets] == [40, 48, 400, 8, 10] and m.nbytes == 506
    assert {b.dtype for b in m.buckets} == {"float32", "float16"}
    m2 = build_manifest(named, version=7, bucket_bytes=1 << 20)
    assert [[e.name for e in m2.tensors if e.bucket == i] for i in range(2)] == [["a", "b", "c", "d"], ["h"]]
    assert Manifest.from_json(m2.to_json()) == m2 and json.loads(m2.to_json())["version"] == 7
    out = {}
    for i in range(len(m2.buckets)):
        buf = empty_bucket(m2, i, torch.device("cpu"))
        buf.copy_(pack_bucket(m2, i, named, torch.device("cpu")))
        out.update(unpack_bucket(m2, i, buf))
    assert all(torch.equal(out[k], v) for k, v in named.items()) and set(out) == set(named)
    assert m2.tensors[1].checksum == tensor_checksum(named["b"])


def test_build_manifest_rejects_empty_input_and_a_bad_bucket_size() -> None:
    with pytest.raises(ValueError, match="empty"):
        build_manifest({}, 1, 100)
    with pytest.raises(ValueError, match="bucket_mb"):
        build_manifest({"a": torch.ones(1)}, 1, 0)
    with pytest.raises(ValueError, match="malformed"):
        Manifest.from_json('{"version": 1}')


def test_named_trainable_tensors_full_and_missing_adapters() -> None:
    m = _mlp()
    assert list(named_trainable_tensors(m, adapters_only=False)) == ["qkv.weight", "qkv.bias", "proj.weight",
                                                                       "proj.bias"]
    with pytest.raises(ValueError, match="no LoRA tensors"):
        named_trainable_tensors(m, adapters_only=True)


# -- binding ---------------------------------------------------------------------------------------------

def test_apply_binds_every_tensor_exactly_and_counts_modules() -> None:
    src, dst = _mlp(seed=0), _mlp(seed=1)
    report = apply_to_module(dst, named_trainable_tensors(src, False), version=3)
    assert (report.version, report.modules_updated, report.tensors_updated) == (3, 2, 4)
    assert report.ok and report.checksum_ok and report.missing == [] and report.unexpected == []
    assert all(torch.equal(dst.state_dict()[k], v) for k, v in src.state_dict().items())


def test_apply_casts_into_a_module_of_another_dtype() -> None:
    src, dst = _mlp(seed=0), _mlp(seed=1).double()
    assert apply_to_module(dst, named_trainable_tensors(src, False)).tensors_updated == 4
    assert torch.equal(dst.qkv.weight, src.qkv.weight.double())


def test_renamed_module_binds_zero_tensors_and_raises_naming_it() -> None:
    src, dst = _mlp(), _mlp(("to_qkv", "proj"), seed=1)
    before = dst.proj.weight.clone()
    with pytest.raises(BindingError, match="bound 0 tensors") as info:
        apply_to_module(dst, named_trainable_tensors(src, False), version=5)
    report = info.value.report
    assert report is not None and report.tensors_updated == 0 and report.modules_updated == 0
    assert report.unexpected == ["qkv.bias", "qkv.weight"] and report.missing == ["to_qkv.bias", "to_qkv.weight"]
    assert "bound 0 tensors" in str(info.value) and "modules: qkv, to_qkv" in str(info.value)
    assert torch.equal(dst.proj.weight, before)  # nothing copied when names do not match
    # the name_map hook repairs it
    fixed = apply_to_module(dst, named_trainable_tensors(src, False),
                            name_map=lambda n: n.replace("qkv.", "to_qkv.", 1))
    assert fixed.tensors_updated == 4 and torch.equal(dst.to_qkv.weight, src.qkv.weight)


def test_a_name_map_that_maps_nothing_is_a_zero_bind() -> None:
    with pytest.raises(BindingError, match="bound 0 tensors"):
        apply_to_module(_mlp(), named_trainable_tensors(_mlp(), False), name_map=lambda n: "engine." + n)


def test_missing_shape_mismatch_duplicates_and_checksum_mismatch_are_errors() -> None:
    src = named_trainable_tensors(_mlp(), False)
    with pytest.raises(BindingError, match=r"missing: proj\.bias"):
        apply_to_module(_mlp(seed=1), {k: v for k, v in src.items() if k != "proj.bias"})
    with pytest.raises(BindingError, match=r"shape \[16\] vs module \[4\]"):
        apply_to_module(_mlp(seed=1), {**src, "proj.bias": torch.zeros(16)})
    with pytest.raises(BindingError, match="duplicate target"):
        apply_to_module(_mlp(seed=1), src, name_map=lambda n: "qkv.bias" if n == "proj.bias" else n)
    sums = {k: tensor_checksum(v) for k, v in src.items()}
    sums["qkv.weight"] = "0" * 32  # what the manifest said differs from what arrived
    with pytest.raises(BindingError, match="checksum mismatch: qkv.weight") as info:
        apply_to_module(_mlp(seed=1), src, checksums=sums)
    assert info.value.report is not None and info.value.report.mismatched == ["qkv.weight"]
    assert not info.value.report.checksum_ok and "checksum mismatch: qkv.weight" in str(info.value)


def test_peft_lora_adapters_bind_by_name_and_a_renamed_target_is_caught() -> None:
    from peft import LoraConfig, inject_adapter_in_model

    def lora(names: tuple[str, str]) -> nn.Module:
        m = _mlp(names)
        inject_adapter_in_model(LoraConfig(r=2, lora_alpha=4, target_modules=[names[0]]), m)
        return m

    src = lora(("qkv", "proj"))
    with torch.no_grad():
        src.qkv.lora_B.default.weight.normal_()
    named = named_trainable_tensors(src, adapters_only=True)
    assert sorted(named) == ["qkv.lora_A.default.weight", "qkv.lora_B.default.weight"]
    dst = lora(("qkv", "proj"))
    report = apply_to_module(dst, named, version=2)
    assert (report.modules_updated, report.tensors_updated) == (2, 2)
    assert torch.equal(dst.qkv.lora_B.default.weight, src.qkv.lora_B.default.weight)
    with pytest.raises(BindingError, match=r"bound 0 tensors.*missing: to_qkv\.lora_A\.default\.weight"):
        apply_to_module(lora(("to_qkv", "proj")), named, version=2)


def test_backend_follows_the_device_and_rejects_mismatches() -> None:
    assert resolve_backend(None, "cpu") == ("gloo", torch.device("cpu"))
    assert resolve_backend(None, "cuda:1") == ("nccl", torch.device("cuda:1"))
    with pytest.raises(ValueError, match="needs torch_npu"):  # no Ascend stack on this machine
        resolve_backend(None, "npu:0")
    assert resolve_backend("gloo", "cuda:0") == ("gloo", torch.device("cpu"))  # staged through host memory
    with pytest.raises(ValueError, match="needs a device of type .cuda."):
        resolve_backend("nccl", "cpu")
    with pytest.raises(ValueError, match="needs a device of type .npu."):
        resolve_backend("hccl", "cpu")
    assert resolve_backend("cuda-ipc", "cuda:0") == ("cuda-ipc", torch.device("cuda:0"))  # stays on the GPU
    with pytest.raises(ValueError, match="backend='cuda-ipc' needs a device of type .cuda."):
        resolve_backend("cuda-ipc", "cpu")
    with pytest.raises(ValueError, match="expected one of"):
        resolve_backend("mpi", "cpu")


def test_nan_weights_bind_bit_exactly() -> None:
    src, dst = _mlp(seed=0), _mlp(seed=1)
    with torch.no_grad():
        src.qkv.weight[0, 0] = float("nan")
    assert apply_to_module(dst, named_trainable_tensors(src, False)).ok
    assert torch.isnan(dst.qkv.weight[0, 0]) and torch.equal(dst.proj.weight, src.proj.weight)


# -- store protocol, in one process (the multi-process cases are in test_weight_sync_procs.py) ------------

def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_first_connect_to_a_dead_address_says_what_it_waits_for_and_ends_on_time(monkeypatch, caplog) -> None:
    """`omnirl role rollout` with OMNIRL_WEIGHT_SYNC_ADDR on a closed port (an actor that died before it
    listened) said nothing until its bound ran out: 1800 s by default, and a 70 s bound took 123 s (the
    store's own retries overshoot). Now it warns every REPORT_EVERY_S with the address, the error, the
    time waited, the deadline, the knob and the caller's note, and ends at its bound."""
    monkeypatch.setattr(receiver_module, "REPORT_EVERY_S", 1.0)
    port = _closed_port()
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="omnirl.weight_sync.receiver"), \
            pytest.raises(WeightSyncError, match=rf"store 127\.0\.0\.1:{port} not reachable within 3\.5 s "
                                                 r"\(the knob\): \[Errno 111\] Connection refused"):
        WeightReceiver("127.0.0.1", port, "w-dead", timeout_s=5, connect_timeout_s=3.5, connect_limit="the knob",
                       connect_note=lambda: "no actor heartbeat")
    assert 3.5 <= time.monotonic() - start < 5.0
    waits = [r.getMessage() for r in caplog.records]
    assert len(waits) == 3, waits  # at 1, 2 and 3 s
    assert waits[0].startswith(f"worker w-dead: waiting for the actor's weight-sync store at 127.0.0.1:{port} "
                               "([Errno 111] Connection refused): 1 s so far, trying until "), waits[0]
    assert waits[0].endswith(" (4 s, the knob); no actor heartbeat"), waits[0]
    assert [w.split(": ")[2].split(" s so far")[0] for w in waits] == ["1", "2", "3"], waits


def test_a_first_connect_waits_for_a_store_that_comes_up_late_and_a_name_that_resolves_late(monkeypatch) -> None:
    """An actor still loading (nothing listens yet) is waited for: the receiver registers once its
    store is up. A name that does not resolve yet (the actor's pod not scheduled) is retried too."""
    monkeypatch.setattr(receiver_module, "REPORT_EVERY_S", 1.0)
    port = _closed_port()
    senders: list[WeightSender] = []
    late = threading.Timer(1.5, lambda: senders.append(WeightSender("127.0.0.1", port, timeout_s=5)))
    late.start()
    try:
        receiver = WeightReceiver("127.0.0.1", port, "w-late", timeout_s=5, connect_timeout_s=20)
        late.join()
        assert senders[0].members() == ["w-late"]
        receiver.close()
    finally:
        late.join()
        for sender in senders:
            sender.close()
    with pytest.raises(WeightSyncError, match=r"omnirl-no-such-actor\.invalid:29500 not reachable within 1\.5 s"):
        WeightReceiver("omnirl-no-such-actor.invalid", 29500, "w-dns", timeout_s=5, connect_timeout_s=1.5)


def test_receiver_reconnects_and_rejoins_after_the_actor_restarts() -> None:
    first = WeightSender("127.0.0.1", 0, timeout_s=5)
    port = first.port
    receiver = WeightReceiver("127.0.0.1", port, "w1", timeout_s=5)
    assert first.members() == ["w1"] and receiver.pending_version() is None
    first.close()  # the actor restarts on the same port
    second = WeightSender("127.0.0.1", port, timeout_s=5)
    assert second.members() == []
    assert receiver.pending_version() is None  # the store error makes it reconnect and register again
    assert second.members() == ["w1"]
    src, dst = _mlp(seed=0), _mlp(seed=1)
    reports: list[BindReport] = []
    thread = threading.Thread(target=lambda: reports.append(receiver.receive(dst)))
    thread.start()
    sync = second.broadcast(named_trainable_tensors(src, False), 9)
    thread.join(timeout=10)
    assert sync.receivers == ["w1"] and reports[0].version == 9 and reports[0].tensors_updated == 4
    assert torch.equal(dst.qkv.weight, src.qkv.weight)
    assert second.serve_new_members(named_trainable_tensors(src, False), 9) is None
    receiver.close()
    assert second.members() == []
    second.close()


def test_receiver_follows_the_actors_backend_or_rejects_a_different_one() -> None:
    sender = WeightSender("127.0.0.1", 0, backend="gloo", timeout_s=5)
    with pytest.raises(ValueError, match="broadcasts with 'gloo'"):
        WeightReceiver("127.0.0.1", sender.port, "w1", backend="nccl", device="cuda:0", timeout_s=5)
    receiver = WeightReceiver("127.0.0.1", sender.port, "w2", device="cuda:0", timeout_s=5)  # auto: nccl
    assert (receiver.backend, receiver.transport) == ("gloo", torch.device("cpu"))
    receiver.close()
    sender.close()


def test_a_receiver_leaving_a_finished_job_does_not_warn_about_the_gone_actor(caplog) -> None:
    sender = WeightSender("127.0.0.1", 0, timeout_s=2)
    ended = WeightReceiver("127.0.0.1", sender.port, "w-end", timeout_s=2)
    leaving = WeightReceiver("127.0.0.1", sender.port, "w-leave", timeout_s=2)
    assert sender.members() == ["w-end", "w-leave"]
    sender.close()  # the actor exits first at the end of a job
    with caplog.at_level("WARNING", logger="omnirl.weight_sync"):
        ended.close(leave=False)  # the job's stop flag is set: nothing to deregister from
        assert caplog.records == []
        leaving.close()  # leaving a job that goes on: the failure is worth a warning
    assert len(caplog.records) == 1
    assert "w-leave: could not deregister" in caplog.records[0].getMessage()


class _FrozenReceiver(WeightReceiver):
    """Becomes ready and joins the group, then takes no part in the broadcast (a SIGSTOPped rollout
    worker) until `release` is set."""

    def __init__(self, *args, joined: threading.Event, release: threading.Event, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.joined, self.release = joined, release

    def _receive_buckets(self, group, manifest, plan):
        self.joined.set()
        self.release.wait()
        raise RuntimeError("released")


@pytest.mark.timeout(90)  # without the in-collective abort, the sender waits out its 600 s collective timeout
def test_abort_ends_a_broadcast_stalled_by_a_frozen_receiver() -> None:
    from omnirl.weight_sync.groups import ABORT_GRACE_S

    stopping, joined, release = threading.Event(), threading.Event(), threading.Event()
    sender = WeightSender("127.0.0.1", 0, timeout_s=600, abort=stopping.is_set)
    frozen = _FrozenReceiver("127.0.0.1", sender.port, "w-frozen", timeout_s=600, joined=joined, release=release)
    errors: list[Exception] = []

    def receive() -> None:
        try:
            frozen.receive(_mlp())
        except Exception as err:  # the receiver's own failure is not under test; keep it for the assert
            errors.append(err)

    worker = threading.Thread(target=receive)
    worker.start()
    threading.Thread(target=lambda: joined.wait() and stopping.set()).start()  # SIGTERM once it froze
    big = {"w": torch.ones(8 * 1024 * 1024)}  # 32 MiB: more than loopback socket buffers take unread
    with pytest.raises(SyncAborted, match=r"weight sync v4 \(generation 1\) aborted during the broadcast of bucket "
                       rf"1/1: the sender is stopping and the collective did not finish within {ABORT_GRACE_S:.0f} s"):
        sender.broadcast(big, 4)
    release.set()
    worker.join()
    assert [type(e).__name__ for e in errors] == ["WeightSyncError"]
    frozen.close()
    sender.close()


@pytest.mark.timeout(60)  # without the abort, the sync waits its whole 600 s for the silent receiver
def test_abort_ends_a_sync_waiting_for_a_silent_receiver() -> None:
    stopping = threading.Event()
    sender = WeightSender("127.0.0.1", 0, timeout_s=600, abort=stopping.is_set)
    silent = WeightReceiver("127.0.0.1", sender.port, "w-stopped", timeout_s=5)  # registered, never receives
    timer = threading.Timer(0.5, stopping.set)  # the actor's SIGTERM handler
    timer.start()
    with pytest.raises(SyncAborted, match=r"weight sync v3 \(generation 1\) aborted"):
        sender.broadcast(named_trainable_tensors(_mlp(), False), 3)
    assert sender.members() == ["w-stopped"]  # not deregistered as lost: it did nothing wrong
    timer.join()
    silent.close()
    sender.close()


def test_a_receiver_restarted_during_a_sync_does_not_fail_it_and_is_served_next(caplog) -> None:
    """A rollout worker SIGKILLed just before the actor's step sync, whose restart registers again while the
    sync waits for the old incarnation (`omnirl run`, tiny AWM job, `kill -9` of rollout-0 right after step 1):
    the sync waited its whole timeout (120 s) for an answer that could not come, then raised
    `ReceiverLost: weight sync v3 (generation 4): no receiver became ready within 120.0 s; lost []`; the actor
    failed and the launcher spent a restart-job. Now the wait ends when the worker registers again, the sync
    returns with no receiver, and `serve_new_members` gives the new incarnation the current weights."""
    sender = WeightSender("127.0.0.1", 0, timeout_s=60)
    killed = WeightReceiver("127.0.0.1", sender.port, "rollout-0", timeout_s=60)  # registered, then SIGKILLed
    restarted: list[WeightReceiver] = []
    timer = threading.Timer(0.5, lambda: restarted.append(WeightReceiver("127.0.0.1", sender.port, "rollout-0",
                                                                         timeout_s=60)))
    timer.start()
    src, dst = _mlp(seed=0), _mlp(seed=1)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING):
        report = sender.broadcast(named_trainable_tensors(src, False), 3)
    assert time.monotonic() - t0 < 10, "waited for the old incarnation"
    assert report.receivers == [] and report.version == 3
    assert "registered again during the sync" in caplog.text
    timer.join()
    assert sender.members() == ["rollout-0"]  # not evicted: it is new, not lost
    reports: list[BindReport] = []
    thread = threading.Thread(target=lambda: reports.append(restarted[0].receive(dst)))
    thread.start()
    served = sender.serve_new_members(named_trainable_tensors(src, False), 3)
    thread.join(timeout=30)
    assert served is not None and served.receivers == ["rollout-0"] and reports[0].version == 3
    assert torch.equal(dst.qkv.weight, src.qkv.weight)
    restarted[0].close()
    killed.close()
    sender.close()
