"""A 2-rank Ulysses rollout replica (`omnirl.rollout.replica`, `omnirl.models.parallel.replica`) generates what one
process generates: the tiny Wan pipeline loaded through its adapter on 2 forked gloo ranks, the leader's engine
driving the follower with the split transformer's calls, against the same engine on one unsplit adapter (same
seeds, an SDE window): the same final latents and log-probabilities (fp32, ≤ 1e-5), every forward made by both
ranks."""

from __future__ import annotations

import json
import multiprocessing
import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tests.video_models import save_tiny

from omnirl.api.loader import job_from_dict

LEADER = "rollout-0"


def _job(path: Path, ulysses: int):
    return job_from_dict({
        "apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "replica"},
        "spec": {"model": {"family": "wan", "path": str(path), "video": {"frames": 5, "height": 32, "width": 48,
                                                                          "fps": 8}},
                 "data": {"trainPrompts": "t.txt"}, "reward": [{"name": "t", "kind": "temporal-consistency"}],
                 "algorithm": {"sampling": {"guidanceScale": 2.0}},
                 "roles": {"rollout": {"parallel": {"ulysses": ulysses}}}}})


def _generate(adapter) -> dict[str, torch.Tensor]:
    from omnirl.rollout.engine import RolloutEngine
    from omnirl.rollout.types import SampleRequest

    engine = RolloutEngine(adapter, max_batch_size=4)
    for p, text in enumerate(["a red ball", "a blue cube"]):
        ids = tuple(adapter.tokenize(text))
        for g in range(2):
            engine.submit(SampleRequest(sample_id=f"0:{p}:{g}", prompt=text, prompt_ids=ids, seed=10 * p + g,
                                        num_steps=4, window=(1, 2), noise_level=0.7, guidance_scale=2.0))
    out: dict[str, torch.Tensor] = {}
    while engine.has_work():
        for r in engine.step():
            out[f"{r.request.sample_id}/x0"] = r.x0.contiguous()
            out[f"{r.request.sample_id}/log_probs"] = r.log_probs.contiguous()
    return out


def _load(job):
    from omnirl.models.registry import adapter_options, load_adapter

    return load_adapter("wan", job.spec.model.path, "cpu", "float32", **adapter_options(job.spec))


def _rank(rank: int, port: int, path: str, out: str) -> None:
    from omnirl.models.parallel.replica import join_replica, parallelize
    from omnirl.rollout.replica import STOP, LeaderAdapter, ReplicaChannel, follow

    torch.set_num_threads(1)
    join_replica(rank, 2, "127.0.0.1", port, torch.device("cpu"))
    job = _job(Path(path), 2)
    adapter = _load(job)
    done = parallelize(adapter, job.spec.roles.rollout.parallel, torch.device("cpu"))
    channel = ReplicaChannel(torch.device("cpu"))
    if rank == 0:
        save_file(_generate(LeaderAdapter(adapter, channel)), str(Path(out) / "replica.safetensors"))
        channel.send(STOP)
        Path(out, "leader.json").write_text(json.dumps(done))
    else:
        Path(out, "follower.json").write_text(json.dumps({"calls": follow(adapter, channel)}))
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(400)
def test_a_two_rank_ulysses_replica_generates_what_one_process_does(tmp_path):
    torch.set_num_threads(1)
    path = save_tiny("wan", tmp_path / "wan")
    reference = _generate(_load(_job(path, 1)))
    ctx = multiprocessing.get_context("fork")
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, str(path), str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0, 0]
    split = load_file(str(tmp_path / "replica.safetensors"))
    assert sorted(split) == sorted(reference) and len(reference) == 8
    for name, t in reference.items():
        assert (split[name] - t).abs().max().item() <= 1e-5, name
    assert json.loads((tmp_path / "leader.json").read_text())["ulysses"] == 2
    # the follower made every call: the engine's encode per sample (the adapters' cache encodes each prompt once,
    # alike on both ranks) and one per engine forward (4 steps of one batch of 4)
    assert json.loads((tmp_path / "follower.json").read_text())["calls"] == 4 + 4
