"""Two FSDP2 actor ranks (gloo, forked processes) train exactly like one actor on the same batch.

The parent makes real rollouts with the digits model (two latent shapes, so micro-batches are
per shape and the ranks' shares need padding), trains one step in-process as the reference, then
two forked ranks run `Trainer` with `Ranks` on the same batch: metrics, updated weights and a
checkpoint round trip must match.
"""

from __future__ import annotations

import copy
import json
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.fsdp  # noqa: F401  (imported once here, inherited by the forked ranks)
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file
from tests.helpers import requests, tiny_adapter

from omnirl.actor.batch import TrainSample
from omnirl.actor.ranks import SINGLE, Ranks
from omnirl.actor.trainer import Trainer
from omnirl.algorithms import group_advantages
from omnirl.api.spec import RLJobSpec
from omnirl.rollout.engine import RolloutEngine

WORLD = 2
CASES = {
    "flow-grpo-full-recompute": {"name": "flow-grpo", "optimizer": {"microBatchSize": 2, "updatesPerStep": 2,
                                                                    "learningRate": 1e-3}},
    "flow-grpo-lora-bypass": {"name": "flow-grpo", "lora": True, "optimizer": {"microBatchSize": 3},
                              "flowGrpo": {"rolloutCorrection": {"mode": "bypass"}}},
    "nft-lora": {"name": "diffusion-nft", "lora": True, "optimizer": {"microBatchSize": 3, "learningRate": 1e-3}},
    # two minibatches: the second one's old log-probs are recomputed on both ranks' shares and merged
    "awm-lora": {"name": "awm", "lora": True, "awm": {"timestepsPerSample": 2},
                 "optimizer": {"microBatchSize": 3, "updatesPerStep": 2, "learningRate": 1e-3}},
}


def _spec(case: str) -> RLJobSpec:
    algorithm = copy.deepcopy(CASES[case])
    lora = algorithm.pop("lora", False)
    return RLJobSpec.model_validate({"data": {"trainPrompts": "p.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}],
                                     "algorithm": algorithm, "model": {"lora": {"enabled": True, "rank": 4, "alpha": 8} if lora else {}}})


def _samples() -> tuple:
    torch.manual_seed(0)
    adapter = tiny_adapter(seed=1)  # every layer live, so LoRA inside the blocks gets gradients
    engine = RolloutEngine(adapter, max_batch_size=16)
    for r in requests(adapter, 3, num_steps=6, window=(1, 2)):  # "123"/"4071": 32×64, "98765": 32×128
        engine.submit(r)
    results = sorted(engine.run_until_idle(), key=lambda r: r.request.sample_id)
    rewards = torch.linspace(0, 1, len(results)) ** 2
    gids = torch.tensor([int(r.request.sample_id.split(":")[1]) for r in results])
    adv = group_advantages(rewards, gids).advantages
    return adapter, [TrainSample(r.request.sample_id, f"0:{int(gids[i])}", list(r.request.prompt_ids), float(adv[i]),
                                 r.x0, r.latents, r.log_probs, r.sigmas, 0.7, "sde") for i, r in enumerate(results)]


def _train(adapter, samples, case: str, ranks: Ranks) -> Trainer:
    torch.manual_seed(7)  # the same LoRA initialisation everywhere
    return Trainer(copy.deepcopy(adapter), _spec(case), ranks=ranks)


def _rank(rank: int, port: int, out: str, adapter, samples) -> None:
    torch.set_num_threads(1)
    ranks = Ranks.init(rank, WORLD, "127.0.0.1", port, "cpu")
    try:
        for case in CASES:
            trainer = _train(adapter, samples, case, ranks)
            metrics = trainer.train_step(samples, step=0)
            trained = trainer.policies.trained_tensors()  # collective: every rank gathers
            path = trainer.save(Path(out) / case, 0, {"step": 0})
            dist.barrier()
            fresh = _train(adapter, samples, case, ranks)
            fresh.load(Path(out) / case / "latest")
            again = fresh.policies.trained_tensors()
            same = all(torch.equal(again[k], trained[k]) for k in trained)
            m2 = trainer.train_step(samples, step=1)
            m2_fresh = fresh.train_step(samples, step=1)
            if rank == 0:
                save_file({k: v.contiguous() for k, v in trained.items()}, Path(out) / f"{case}.safetensors")
                Path(out, f"{case}.json").write_text(json.dumps({
                    "metrics": metrics, "saved": path is not None, "reload_equal": same,
                    "resumed_loss_diff": abs(m2["loss"] - m2_fresh["loss"])}))
            else:
                assert path is None
        skip = ranks.agree(5, 12, done=rank == 0)  # the leader's "already done" decides for every rank
        try:
            ranks.agree(5 + rank, 12, done=False)
            mismatch = ""
        except RuntimeError as err:
            mismatch = str(err)
        Path(out, f"agree-{rank}.json").write_text(json.dumps({"skip": skip, "mismatch": mismatch}))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # ~2 min on 2 shared cores
@pytest.mark.timeout(300)
def test_two_actor_ranks_train_like_one(tmp_path):
    torch.set_num_threads(1)
    adapter, samples = _samples()
    mp.start_processes(_rank, args=(_free_port(), str(tmp_path), adapter, samples), nprocs=WORLD, join=True,
                       start_method="fork")
    for rank in range(WORLD):
        agree = json.loads((tmp_path / f"agree-{rank}.json").read_text())
        assert agree["skip"] is True and "disagree on the train request: steps 5..6" in agree["mismatch"]
    for case in CASES:
        reference = _train(adapter, samples, case, SINGLE)
        ref_metrics = reference.train_step(samples, step=0)
        ref_weights = reference.policies.trained_tensors()
        got = json.loads((tmp_path / f"{case}.json").read_text())
        weights = load_file(tmp_path / f"{case}.safetensors")
        assert got["saved"] and got["reload_equal"], case
        assert got["resumed_loss_diff"] < 1e-6, case  # optimizer state survived the sharded round trip
        for key in ("loss", "kl", "grad_norm"):
            assert got["metrics"][key] == pytest.approx(ref_metrics[key], rel=1e-4, abs=1e-7), (case, key)
        assert got["metrics"]["optimizer_steps"] == ref_metrics["optimizer_steps"]
        moved = max(float((ref_weights[k] - reference_before).abs().max())
                    for k, reference_before in _train(adapter, samples, case, SINGLE).policies.trained_tensors().items())
        assert moved > 0, case
        for k, w in ref_weights.items():
            torch.testing.assert_close(weights[k], w, atol=2e-6, rtol=1e-4, msg=f"{case}: {k}")


def test_share_pads_every_rank_to_the_same_count():
    shares = [Ranks(rank, 3).share(list("abcde")) for rank in range(3)]
    assert [len(s) for s in shares] == [2, 2, 2]
    assert shares[0] == [("a", 1.0), ("d", 1.0)]
    assert shares[1] == [("b", 1.0), ("e", 1.0)]
    assert shares[2] == [("c", 1.0), ("e", 0.0)]  # padding repeats the last micro-batch with weight 0
    assert SINGLE.share(["x", "y"]) == [("x", 1.0), ("y", 1.0)] and Ranks(0, 2).grad_scale == 2.0
    with pytest.raises(ValueError, match="outside"):
        Ranks.init(2, 2, "127.0.0.1", 1, "cpu")
