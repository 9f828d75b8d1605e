"""The actor's ranks with Ulysses (`omnirl.actor.ranks.Ranks(ulysses=U)`, `PolicySet.shard`): FSDP2 over every rank,
each Ulysses group of U consecutive ranks sharing its micro-batches and splitting their tokens, give one process's
AdamW step on a tiny random Wan transformer (fp32): 2 gloo ranks (one data-parallel rank of Ulysses 2), and 4 ranks
(2 data-parallel × Ulysses 2, slow) with HSDP (2 replicate groups) as well. The step is the update functions' own:
`ranks.share` deals micro-batches, each loss is weighted by its share of the batch and `ranks.grad_scale`.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tests import tiny_transformers

from omnirl.actor.fsdp import gather_full_state, hsdp_mesh, shard_model
from omnirl.actor.ranks import Ranks
from omnirl.models.parallel.ulysses import enable_ulysses, ulysses_mesh

SAMPLES = 4


def _batch():
    _, inputs = tiny_transformers.build("wan", even=False, batch=2)
    g = torch.Generator().manual_seed(5)
    return [{**inputs, "hidden_states": torch.randn(inputs["hidden_states"].shape[1:], generator=g)[None],
             "timestep": inputs["timestep"][:1] * (i + 1) / 2, "encoder_hidden_states": inputs["encoder_hidden_states"][:1]}
            for i in range(SAMPLES)]


def _step(model, micro_batches, ranks: Ranks) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for mb, w in ranks.share(micro_batches):
        loss = tiny_transformers.loss(tiny_transformers.velocity(model, mb)) / len(micro_batches)
        (loss * (w * ranks.grad_scale)).backward()
    opt.step()


def _worker(rank: int, world: int, ulysses: int, replicate: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        batch = _batch()
        reference, _ = tiny_transformers.build("wan", even=False)
        before = {n: t.clone() for n, t in reference.state_dict().items()}
        _step(reference, batch, Ranks())
        ranks = Ranks(rank, world, "cpu", ulysses)
        model, _ = tiny_transformers.build("wan", even=False)
        enable_ulysses(model, ulysses_mesh(ulysses, "cpu", data_parallel=ranks.dp_world))
        shard_model(model, world if replicate == 1 else hsdp_mesh(ranks, replicate))
        _step(model, batch, ranks)
        after = dict(gather_full_state(model))
        want = reference.state_dict()
        Path(out, f"{rank}.json").write_text(json.dumps({
            "diff": max((after[n] - t).abs().max().item() for n, t in want.items()),
            "moved": max((t - before[n]).abs().max().item() for n, t in want.items()),
            "shared": [next(k for k, b in enumerate(batch) if b is mb) for mb, w in ranks.share(batch) if w],
            "dp_rank": ranks.dp_rank}))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(world: int, ulysses: int, replicate: int, tmp_path: Path) -> list[dict]:
    import diffusers  # noqa: F401  (imported before the fork)

    mp.start_processes(_worker, args=(world, ulysses, replicate, _free_port(), str(tmp_path)), nprocs=world,
                       join=True, start_method="fork")
    return [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(world)]


@pytest.mark.timeout(300)
def test_two_ranks_of_one_ulysses_group_take_one_processs_step(tmp_path):
    results = _run(2, 2, 1, tmp_path)
    for r in results:
        assert r["diff"] <= 2e-6 and r["moved"] > 1e-3, r
        assert r["dp_rank"] == 0 and len(r["shared"]) == SAMPLES  # both ranks train every micro-batch


@pytest.mark.slow
@pytest.mark.omni
@pytest.mark.timeout(600)
@pytest.mark.parametrize("replicate", [1, 2])
def test_four_ranks_two_data_parallel_ulysses_groups_fsdp_and_hsdp(tmp_path, replicate):
    results = _run(4, 2, replicate, tmp_path)
    for r in results:
        assert r["diff"] <= 2e-6 and r["moved"] > 1e-3, r
    assert [r["dp_rank"] for r in results] == [0, 0, 1, 1]
    assert results[0]["shared"] == results[1]["shared"] != results[2]["shared"] == results[3]["shared"]
