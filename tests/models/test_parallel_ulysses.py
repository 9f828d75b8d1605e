"""Ulysses sequence parallelism through diffusers' API (`omnirl.models.parallel.ulysses`): a replica of 2 or 4
gloo processes gives one process's velocity (fp32, ≤ 1e-5) and, summed over the group, its gradients, for tiny
random Wan, LTX-2 and MiniMax-H3 transformers, with token counts that divide by the degree and ones that do not
(diffusers' Ulysses-Anything path, whose backward `UlyssesAnythingAttention` adds).

Each spawned rank computes the single-process reference itself (the same seeded model, unsharded), then the
sharded replica's, and writes the differences to JSON for the parent to assert on.
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

from omnirl.models.parallel.ulysses import enable_ulysses, reduce_gradients, ulysses_mesh


def _worker(rank: int, world: int, port: int, out_dir: str, cases: list) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = ulysses_mesh(world, "cpu")
        results = {}
        for family, even in cases:
            reference, inputs = tiny_transformers.build(family, even=even)
            ref_out = tiny_transformers.velocity(reference, inputs)
            tiny_transformers.loss(ref_out).backward()
            model, _ = tiny_transformers.build(family, even=even)
            enable_ulysses(model, mesh)
            out = tiny_transformers.velocity(model, inputs)
            tiny_transformers.loss(out).backward()
            reduced = reduce_gradients(model)
            ref_grads = dict(reference.named_parameters())
            grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
            results[f"{family}/{even}"] = {
                "tokens": [o.shape[1] for o in out],
                "velocity": max((a - b).abs().max().item() for a, b in zip(out, ref_out, strict=True)),
                "scale": max(b.abs().max().item() for b in ref_out),
                "grad": max((g - ref_grads[n].grad).abs().max().item() for n, g in grads.items()),
                "grad_scale": max(p.grad.abs().max().item() for p in reference.parameters() if p.grad is not None),
                "reduced": reduced, "with_grad": sum(p.grad is not None for p in reference.parameters()),
                "names": sorted(grads) == sorted(n for n, p in ref_grads.items() if p.grad is not None),
            }
        Path(out_dir, f"{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(world: int, cases: list, tmp_path: Path) -> list[dict]:
    # fork: the ranks inherit the imported torch and diffusers (spawn re-imports them: ~10 s per rank)
    mp.start_processes(_worker, args=(world, _free_port(), str(tmp_path), cases), nprocs=world, join=True,
                       start_method="fork")
    return [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(world)]


def _check(results: list[dict]) -> None:
    for per_rank in results:
        for case, r in per_rank.items():
            assert r["velocity"] <= 1e-5, (case, r)
            assert r["grad"] <= 1e-5 * max(1.0, r["grad_scale"]), (case, r)
            assert r["names"] and r["reduced"] == r["with_grad"] > 0, (case, r)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("family", tiny_transformers.FAMILIES)
def test_two_ranks_match_one_process_even_and_uneven_lengths(family, tmp_path):
    import diffusers  # noqa: F401  (imported before the fork)

    results = _run(2, [(family, True), (family, False)], tmp_path)
    _check(results)


@pytest.mark.slow
@pytest.mark.omni
@pytest.mark.timeout(600)
def test_four_ranks_match_one_process(tmp_path):
    import diffusers  # noqa: F401

    _check(_run(4, [(f, e) for f in tiny_transformers.FAMILIES for e in (True, False)], tmp_path))
