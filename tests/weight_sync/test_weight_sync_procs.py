"""Weight sync across real OS processes (multiprocessing spawn) and real gloo groups on loopback.

One sender (this process) and receiver processes driven by JSON commands: they bind into their own
modules and write their state_dicts as safetensors files, which this process compares bit for bit.
The tests of the `cluster` fixture run in file order and share its processes (each pays ~5 s of
`import torch` on a loaded 2-core machine, so they are started once, in parallel).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from omnirl.weight_sync import (
    BindingError,
    ReceiverLost,
    WeightReceiver,
    WeightSender,
    named_trainable_tensors,
)

SENDER_TIMEOUT_S = 4.0
RECEIVER_TIMEOUT_S = 60.0
BUCKET_MB = 0.0005  # 524 bytes: forces several buckets even for the tiny model
STARTUP_S = 120.0


def _mlp(names: tuple[str, str, str] = ("qkv", "proj", "out"), seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(OrderedDict([(names[0], nn.Linear(8, 16)), ("act", nn.ReLU()),
                                      (names[1], nn.Linear(16, 16)), ("act2", nn.ReLU()),
                                      (names[2], nn.Linear(16, 4))]))


def _lora(names: tuple[str, str, str] = ("qkv", "proj", "out")) -> nn.Module:
    from peft import LoraConfig, inject_adapter_in_model

    module = _mlp(names, seed=0)  # the same base weights on every side
    inject_adapter_in_model(LoraConfig(r=2, lora_alpha=4, target_modules=list(names[:2])), module)
    return module


def _build(kind: str, worker_id: str) -> nn.Module:
    seed = 1 + sum(map(ord, worker_id))  # receivers start from weights unlike the sender's
    return {"mlp": lambda: _mlp(seed=seed), "mlp_renamed": lambda: _mlp(("to_qkv", "proj", "out"), seed),
            "lora": _lora, "lora_renamed": lambda: _lora(("to_qkv", "proj", "out"))}[kind]()


def _die_before_ack(receiver: WeightReceiver) -> None:
    """Make the next `receive` take every bucket, then kill the process before it acknowledges."""
    real = receiver._receive_buckets

    def die(*args: object) -> None:
        real(*args)
        os._exit(3)

    receiver._receive_buckets = die  # type: ignore[method-assign]


def _worker(port: int, out_dir: str, cmd_q: mp.Queue, res_q: mp.Queue) -> None:
    """A receiver process: waits for JSON commands (connect, build, receive, stop); answers JSON."""
    torch.set_num_threads(1)
    receiver: WeightReceiver | None = None
    models: dict[str, nn.Module] = {}
    res_q.put(json.dumps({"started": os.getpid()}))
    while True:
        cmd = json.loads(cmd_q.get(timeout=STARTUP_S))
        if cmd["op"] == "stop":
            if receiver is not None:
                receiver.close()
            return
        if cmd["op"] == "connect":
            receiver = WeightReceiver("127.0.0.1", port, cmd["worker_id"], timeout_s=RECEIVER_TIMEOUT_S)
            res_q.put(json.dumps({"ok": True}))
            continue
        assert receiver is not None
        module = models.setdefault(cmd["model"], _build(cmd["model"], receiver.worker_id))
        if cmd["op"] == "build":  # build (import peft) before the sync, as a rollout worker does
            res_q.put(json.dumps({"ok": True}))
            continue
        if cmd.get("die_before_ack"):
            _die_before_ack(receiver)
        try:
            report = receiver.receive(module)
        except BindingError as err:
            res_q.put(json.dumps({"ok": False, "error": str(err), "mismatch": err.mismatch}))
            continue
        state = {k: v.contiguous() for k, v in module.state_dict().items()}
        save_file(state, str(Path(out_dir) / f"{receiver.worker_id}-{cmd['tag']}.safetensors"))
        res_q.put(json.dumps({"ok": True, "report": vars(report)}))


@dataclass
class Proc:
    process: mp.Process
    cmd_q: mp.Queue
    res_q: mp.Queue

    def send(self, **cmd: object) -> None:
        self.cmd_q.put(json.dumps(cmd))

    def result(self, timeout: float = RECEIVER_TIMEOUT_S) -> dict:
        return json.loads(self.res_q.get(timeout=timeout))


@dataclass
class Cluster:
    sender: WeightSender
    out: Path
    procs: dict[str, Proc] = field(default_factory=dict)

    def connect(self, name: str, worker_id: str) -> None:
        self.procs[name].send(op="connect", worker_id=worker_id)
        assert self.procs[name].result()["ok"]

    def receive(self, names: list[str], **cmd: object) -> None:
        """Have each named process build its module, then wait in `WeightReceiver.receive`."""
        for n in names:
            self.procs[n].send(op="build", model=cmd["model"])
        for n in names:
            assert self.procs[n].result(timeout=STARTUP_S)["ok"]
        for n in names:
            self.procs[n].send(op="receive", **cmd)

    def assert_same(self, worker_id: str, tag: str, module: nn.Module) -> None:
        got = load_file(str(self.out / f"{worker_id}-{tag}.safetensors"))
        want = module.state_dict()
        assert set(got) == set(want)
        for k, v in want.items():
            assert torch.equal(got[k], v), f"{worker_id} {tag}: {k} differs"


def _start(port: int, out: Path, names: list[str]) -> dict[str, Proc]:
    ctx = mp.get_context("spawn")
    procs = {}
    for n in names:
        cmd_q, res_q = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=_worker, args=(port, str(out), cmd_q, res_q), daemon=True)
        p.start()
        procs[n] = Proc(p, cmd_q, res_q)
    for proc in procs.values():
        assert "started" in proc.result(timeout=STARTUP_S)
    return procs


def _stop(procs: dict[str, Proc]) -> None:
    for proc in procs.values():
        if proc.process.is_alive():
            proc.send(op="stop")
    for proc in procs.values():
        proc.process.join(timeout=10)
        if proc.process.is_alive():
            proc.process.kill()
            proc.process.join(timeout=5)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Sender + four idle receiver processes: w1, w2 register now; 'late' and 'restart' on demand."""
    sender = WeightSender("127.0.0.1", 0, bucket_mb=BUCKET_MB, timeout_s=SENDER_TIMEOUT_S)
    c = Cluster(sender, tmp_path_factory.mktemp("weight_sync"))
    try:
        c.procs = _start(sender.port, c.out, ["w1", "w2", "late", "restart"])
        c.connect("w1", "w1")
        c.connect("w2", "w2")
        yield c
    finally:
        _stop(c.procs)
        sender.close()


SOURCE = _mlp()  # the actor's model, shared by the ordered tests below


def test_full_sync_to_two_receivers_is_bit_identical_and_version_2_follows(cluster: Cluster) -> None:
    assert cluster.sender.members() == ["w1", "w2"]
    for version in (1, 2):
        if version == 2:
            with torch.no_grad():
                for p in SOURCE.parameters():
                    p.mul_(-0.5).add_(0.25)
        cluster.receive(["w1", "w2"], model="mlp", tag=f"v{version}")
        report = cluster.sender.broadcast(named_trainable_tensors(SOURCE, adapters_only=False), version)
        assert report.version == version and report.receivers == ["w1", "w2"]
        assert report.bytes == 4 * sum(p.numel() for p in SOURCE.parameters())  # fp32
        assert report.buckets >= 4  # 524-byte buckets: qkv.weight (512 B) alone, ...
        for w in ("w1", "w2"):
            res = cluster.procs[w].result()
            assert res["ok"] and res["report"]["version"] == version
            assert res["report"]["modules_updated"] == 3 and res["report"]["tensors_updated"] == 6
            assert res["report"]["checksum_ok"] and not res["report"]["missing"]
            cluster.assert_same(w, f"v{version}", SOURCE)
        if version == 2:
            assert report.group_seconds == 0.0  # membership unchanged: the cached group was reused


def test_late_joiner_gets_the_current_version_from_serve_new_members(cluster: Cluster) -> None:
    named = named_trainable_tensors(SOURCE, adapters_only=False)
    assert cluster.sender.serve_new_members(named, 2) is None  # everyone has v2
    cluster.connect("late", "w3")  # a worker started after v2 was sent
    cluster.receive(["late"], model="mlp", tag="late")
    report = cluster.sender.serve_new_members(named, 2)
    assert report is not None and report.receivers == ["w3"] and report.version == 2
    res = cluster.procs["late"].result()
    assert res["ok"] and res["report"]["tensors_updated"] == 6
    cluster.assert_same("w3", "late", SOURCE)
    assert cluster.sender.serve_new_members(named, 2) is None
    assert cluster.sender.members() == ["w1", "w2", "w3"]


def test_renamed_module_fails_binding_on_both_sides(cluster: Cluster) -> None:
    cluster.receive(["w1"], model="mlp_renamed", tag="v3")  # engine renamed qkv -> to_qkv
    cluster.receive(["w2", "late"], model="mlp", tag="v3")
    with pytest.raises(BindingError, match="bound 0 tensors") as info:
        cluster.sender.broadcast(named_trainable_tensors(SOURCE, adapters_only=False), 3)
    assert list(info.value.failures) == ["w1"]
    # names that do not fit: a configuration mismatch (omnirl role exits 4 on both sides, not restarted)
    assert info.value.mismatch is True
    message = str(info.value)
    assert "w1" in message and "bound 0 tensors" in message and "to_qkv" in message and "modules: qkv" in message
    res = cluster.procs["w1"].result()
    assert not res["ok"] and "qkv.weight" in res["error"] and "to_qkv.weight" in res["error"]
    assert res["mismatch"] is True
    assert cluster.procs["w2"].result()["ok"] and cluster.procs["late"].result()["ok"]
    cluster.assert_same("w2", "v3", SOURCE)


def test_receiver_killed_mid_sync_is_reported_lost_and_dropped(cluster: Cluster) -> None:
    cluster.receive(["w1", "w2"], model="mlp", tag="v4")
    cluster.receive(["late"], model="mlp", tag="v4", die_before_ack=True)
    t0 = time.monotonic()
    with pytest.raises(ReceiverLost, match="w3") as info:
        cluster.sender.broadcast(named_trainable_tensors(SOURCE, adapters_only=False), 4)
    assert time.monotonic() - t0 < 3 * SENDER_TIMEOUT_S
    assert info.value.lost == ["w3"] and "w3" in str(info.value)
    assert info.value.report is not None and info.value.report.receivers == ["w1", "w2"]
    assert cluster.sender.members() == ["w1", "w2"] and cluster.sender.lost_total == 1
    cluster.procs["late"].process.join(timeout=10)
    assert cluster.procs["late"].process.exitcode == 3
    for w in ("w1", "w2"):
        assert cluster.procs[w].result()["ok"]


def test_restarted_receiver_rejoins_and_gets_current_weights(cluster: Cluster) -> None:
    named = named_trainable_tensors(SOURCE, adapters_only=False)
    cluster.connect("restart", "w3")  # a new process under the dead worker's id
    cluster.receive(["restart"], model="mlp", tag="rejoin")
    report = cluster.sender.serve_new_members(named, 4)
    assert report is not None and report.receivers == ["w3"]
    assert cluster.procs["restart"].result()["ok"]
    cluster.assert_same("w3", "rejoin", SOURCE)
    cluster.procs["restart"].send(op="stop")  # close() deregisters
    cluster.procs["restart"].process.join(timeout=10)
    assert cluster.sender.members() == ["w1", "w2"]


@pytest.mark.slow
def test_lora_adapters_only_sync_across_processes(tmp_path: Path) -> None:
    """peft-wrapped sender and receivers: only adapters travel; a renamed target binds 0 and fails."""
    source = _lora()
    with torch.no_grad():
        for name, p in source.named_parameters():
            if "lora_" in name:
                p.normal_()
    sender = WeightSender("127.0.0.1", 0, timeout_s=SENDER_TIMEOUT_S)
    c = Cluster(sender, tmp_path)
    try:
        c.procs = _start(sender.port, tmp_path, ["a", "b"])
        c.connect("a", "a")
        c.connect("b", "b")
        named = named_trainable_tensors(source, adapters_only=True)
        assert len(named) == 4 and all("lora_" in n for n in named)
        c.receive(["a", "b"], model="lora", tag="v1")
        report = sender.broadcast(named, 1)
        assert report.receivers == ["a", "b"] and report.bytes == 4 * sum(t.numel() for t in named.values())
        for w in ("a", "b"):
            res = c.procs[w].result()
            assert res["report"]["modules_updated"] == 4 and res["report"]["tensors_updated"] == 4
            c.assert_same(w, "v1", source)  # base weights equal by seed, adapters by the sync
        c.receive(["a"], model="lora_renamed", tag="v2")
        c.receive(["b"], model="lora", tag="v2")
        with pytest.raises(BindingError, match=r"bound 0 tensors.*qkv\.lora_A\.default"):
            sender.broadcast(named, 2)
        assert "to_qkv.lora_A.default.weight" in c.procs["a"].result()["error"]
        assert c.procs["b"].result()["ok"]
    finally:
        _stop(c.procs)
        sender.close()
