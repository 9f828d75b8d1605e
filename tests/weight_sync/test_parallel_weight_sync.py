"""Weight sync to sharded rollout replicas (docs/parallel.md): every rank of a replica is a receiver of the actor's
broadcast and keeps what it holds, with the binding check per rank. Real processes, real gloo groups: the sender
is this process; each replica is 2 forked ranks with their own process group (the replica's) beside the
weight-sync group.

- A tensor-parallel Qwen-Image replica (full fine-tuning): each rank binds its shard of every split weight
  (`BindReport.shards`), and the replica's forward then equals one process's forward of the sent weights.
- A Ulysses Wan replica with LoRA: each rank binds the adapters whole, and the replica's forward equals one
  process's forward of the sender's model.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from tests import tiny_transformers

from omnirl.weight_sync import WeightReceiver, WeightSender, named_trainable_tensors

LORA_TARGETS = ["to_q", "to_k", "to_v"]


def _qwen(seed: int) -> torch.nn.Module:
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(seed)
    return QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=2,
                                       attention_head_dim=16, num_attention_heads=4, joint_attention_dim=16,
                                       axes_dims_rope=(8, 4, 4)).float().eval()


def _qwen_inputs() -> dict:
    g = torch.Generator().manual_seed(1)
    return {"hidden_states": torch.randn(2, 16, 16, generator=g), "encoder_hidden_states": torch.randn(2, 5, 16, generator=g),
            "encoder_hidden_states_mask": torch.ones(2, 5), "timestep": torch.tensor([0.5, 0.2]),
            "img_shapes": [[(1, 4, 4)]] * 2, "return_dict": False}


def _wan_lora(seed: int, lora_seed: int | None) -> tuple[torch.nn.Module, dict]:
    """Tiny Wan (weights from `seed`) with LoRA adapters (peft, random from `lora_seed`, or zero-B as peft inits)."""
    from peft import LoraConfig, inject_adapter_in_model

    model, inputs = tiny_transformers.build("wan", seed=seed, even=False)
    inject_adapter_in_model(LoraConfig(r=2, lora_alpha=4, target_modules=LORA_TARGETS), model)
    if lora_seed is not None:
        g = torch.Generator().manual_seed(lora_seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model.eval(), inputs


def _rank(kind: str, rank: int, replica_port: int, sync_port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(replica_port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    receiver = None
    try:
        if kind == "tensor":
            from omnirl.models.parallel.tensor import enable_tensor_parallel, tensor_mesh

            model, inputs = _qwen(seed=0), _qwen_inputs()
            enable_tensor_parallel(model, tensor_mesh(2, "cpu"))
            reference = _qwen(seed=5)  # the weights the sender sends
        else:
            from omnirl.models.parallel.ulysses import enable_ulysses, ulysses_mesh

            model, inputs = _wan_lora(seed=0, lora_seed=None)
            enable_ulysses(model, ulysses_mesh(2, "cpu"))
            reference, _ = _wan_lora(seed=0, lora_seed=9)
        receiver = WeightReceiver("127.0.0.1", sync_port, f"rollout-0.r{rank}", timeout_s=120)
        report = receiver.receive(model)
        with torch.no_grad():  # return_dict=False: diffusers' context-parallel hooks take tensors, not outputs
            out = model(**{**inputs, "return_dict": False})[0]
            want = reference(**{**inputs, "return_dict": False})[0]
        split = next((p for p in model.parameters() if type(p).__name__ == "DTensor"), None)
        Path(out_dir, f"{kind}-{rank}.json").write_text(json.dumps({
            "ok": report.ok, "tensors": report.tensors_updated, "shards": report.shards,
            "diff": (out - want).abs().max().item(),
            "held": None if split is None else [split.to_local().numel(), split.numel()]}))
    finally:
        if receiver is not None:
            receiver.close()
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sync(kind: str, tensors: dict[str, torch.Tensor], tmp_path: Path) -> list[dict]:
    sender = WeightSender("127.0.0.1", 0, bucket_mb=0.01, timeout_s=120)
    port = _free_port()
    ctx = multiprocessing.get_context("fork")  # the ranks inherit torch and diffusers (spawn: ~10 s each)
    procs = [ctx.Process(target=_rank, args=(kind, r, port, sender.port, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + 180
        while len(sender.members()) < 2:  # both ranks registered: they are receivers of their own
            assert time.monotonic() < deadline and all(p.is_alive() for p in procs), "ranks did not register"
            time.sleep(0.1)
        report = sender.broadcast(tensors, version=1)
        assert report.receivers == ["rollout-0.r0", "rollout-0.r1"]
        for p in procs:
            p.join(180)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        sender.close()
    return [json.loads((tmp_path / f"{kind}-{r}.json").read_text()) for r in range(2)]


@pytest.mark.timeout(400)
def test_each_rank_of_a_tensor_parallel_replica_binds_its_shard_of_full_weights(tmp_path):
    import diffusers  # noqa: F401  (imported before the fork)

    sent = named_trainable_tensors(_qwen(seed=5), adapters_only=False)
    for r in _sync("tensor", sent, tmp_path):
        assert r["ok"] and r["tensors"] == len(sent), r
        assert 0 < r["shards"] < r["tensors"], r  # split layers bound by shard, the rest (norms, embedders) whole
        assert r["held"][0] * 2 == r["held"][1], r  # a split weight: this rank keeps half of it
        assert r["diff"] <= 1e-5, r


@pytest.mark.timeout(400)
def test_each_rank_of_a_ulysses_replica_binds_the_lora_adapters_whole(tmp_path):
    import diffusers  # noqa: F401
    import peft  # noqa: F401

    sent = named_trainable_tensors(_wan_lora(seed=0, lora_seed=9)[0], adapters_only=True)
    for r in _sync("ulysses", sent, tmp_path):
        assert r["ok"] and r["tensors"] == len(sent) == 2 * 2 * 3 * 2, r  # 2 blocks × 2 attentions × q,k,v × A,B
        assert r["shards"] == 0 and r["held"] is None, r
        assert r["diff"] <= 1e-5, r
