"""FSDP2 on CPU: 2 gloo processes give the same loss, update and gathered weights as 1 process.

Each spawned rank builds the same seeded model, computes the single-process reference itself (full
batch, no sharding), then the sharded run on its half of the batch, and writes what it measured to
JSON for the parent to assert on.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.fsdp  # noqa: F401  (imported once here, inherited by the forked ranks)
import torch.multiprocessing as mp
from torch import nn
from torch.distributed._composable import checkpoint  # noqa: F401

from omnirl.actor.fsdp import enable_activation_checkpointing, find_blocks, gather_full_state, shard_model

WORLD = 2


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update (peft's naming: lora_A, lora_B)."""

    def __init__(self, fan_in: int, fan_out: int, rank: int = 2) -> None:
        super().__init__()
        self.base = nn.Linear(fan_in, fan_out).requires_grad_(False)
        self.lora_A, self.lora_B = nn.Linear(fan_in, rank, bias=False), nn.Linear(rank, fan_out, bias=False)

    def forward(self, x):
        return self.base(x) + self.lora_B(self.lora_A(x))


class Block(nn.Module):
    """A pre-norm residual MLP block (a transformer block without attention)."""

    def __init__(self, dim: int, lora: bool = False) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = LoRALinear(dim, 4 * dim) if lora else nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class Tiny(nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self, dim: int = 8, lora: bool = False) -> None:
        super().__init__()
        self.inp = nn.Linear(3, dim)
        self.blocks = nn.ModuleList([Block(dim, lora), Block(dim, lora)])
        self.out = nn.Linear(dim, 2)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 3, generator=g), torch.randn(8, 2, generator=g)


def _train_step(model, x, y):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        x, y = _data()
        torch.manual_seed(0)
        reference = Tiny()
        torch.manual_seed(0)
        model = Tiny()
        before = {n: t.clone() for n, t in reference.state_dict().items()}
        ref_loss = _train_step(reference, x, y)

        assert enable_activation_checkpointing(model) == 2
        shard_model(model, WORLD)
        gathered_before = dict(gather_full_state(model, bucket_bytes=600))  # several buckets
        half = slice(rank * 4, rank * 4 + 4)
        loss = _train_step(model, x[half], y[half])
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        after = dict(gather_full_state(model))
        result = {
            "loss": loss.item(), "ref_loss": ref_loss.item(),
            "names_equal": sorted(after) == sorted(reference.state_dict()),
            "before_diff": max((gathered_before[n] - t).abs().max().item() for n, t in before.items()),
            "after_diff": max((after[n] - t).abs().max().item() for n, t in reference.state_dict().items()),
            "moved": max((after[n] - t).abs().max().item() for n, t in before.items()),
            "sharded": type(model.inp.weight).__name__, "local_rows": model.inp.weight.to_local().shape[0],
        }
        result.update(_lora_phase(rank, x, y))
        Path(out_dir, f"{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def _lora_phase(rank: int, x, y) -> dict:
    """LoRA: frozen base + trainable adapters in the same FSDP units; adapters-only gathering."""
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        model = Tiny(lora=True)
        for name, p in model.named_parameters():
            p.requires_grad_("lora_" in name)
        models.append(model)
    reference, model = models
    ref_loss = _train_step(reference, x, y)
    shard_model(model, WORLD, reshard_after_forward=False)
    half = slice(rank * 4, rank * 4 + 4)
    loss = _train_step(model, x[half], y[half])
    dist.all_reduce(loss, op=dist.ReduceOp.AVG)
    adapters = dict(gather_full_state(model, adapters_only=True))
    ref = {n: t for n, t in reference.state_dict().items() if "lora_" in n}
    return {"lora_loss_diff": abs(loss.item() - ref_loss.item()), "lora_names": sorted(adapters) == sorted(ref),
            "lora_count": len(adapters), "lora_diff": max((adapters[n] - t).abs().max().item() for n, t in ref.items())}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(180)
def test_two_gloo_ranks_match_one_process(tmp_path):
    # fork: the ranks inherit the imported torch (spawn re-imports it: ~10 s per rank on 2 busy cores)
    mp.start_processes(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=True, start_method="fork")
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(WORLD)]
    for r in results:
        assert r["sharded"] == "DTensor" and r["local_rows"] == 4  # inp.weight [8, 3] split over 2 ranks
        assert r["names_equal"]
        assert r["loss"] == pytest.approx(r["ref_loss"], abs=1e-6)
        assert r["before_diff"] == 0.0
        assert r["after_diff"] < 1e-6 and r["moved"] > 1e-3  # the step changed weights, identically
        assert r["lora_names"] and r["lora_count"] == 4  # 2 blocks × (lora_A, lora_B)
        assert r["lora_loss_diff"] < 1e-6 and r["lora_diff"] < 1e-6


def test_find_blocks_and_errors():
    model = Tiny()
    assert find_blocks(model) == list(model.blocks)
    assert find_blocks(nn.Sequential(nn.ModuleList([nn.Linear(2, 2), nn.ReLU()]))) != []
    with pytest.raises(ValueError, match="no transformer block"):
        find_blocks(nn.Linear(2, 2))
    with pytest.raises(RuntimeError, match="init_process_group"):
        shard_model(Tiny(), 2)


def test_gather_full_state_plain_module_and_adapters_only():
    model = Tiny()
    full = dict(gather_full_state(model, bucket_bytes=1))
    assert list(full) == list(model.state_dict()) and all(torch.equal(full[n], t) for n, t in model.state_dict().items())
    assert dict(gather_full_state(model, adapters_only=True)) == {}
    with pytest.raises(ValueError, match="bucket_bytes"):
        next(gather_full_state(model, bucket_bytes=0))
