"""The ledger holds one line per published sample even when a worker dies between its publish and
its ledger line (`make chaos` in CI: "trained but never scored", lost=1): a real RewardService
against a real redis-server, the first worker killed (an exception) right after one publish."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
import torch
from tests.helpers import jpeg_reward_job

from omnirl.api.ledger import Ledger
from omnirl.api.messages import SampleMeta
from omnirl.reward.service import GROUP, RewardService
from omnirl.rollout.service import RolloutService
from omnirl.transfer import TransferQueue

JOB, N = "ledger", 3


def _ids(out: Path, role: str) -> list[str]:
    return [json.loads(line)["sample_id"] for f in sorted((out / "ledger").glob(f"{role}-*.jsonl"))
            for line in f.read_text().splitlines()]


def test_a_duplicate_writes_only_what_no_ledger_of_the_role_has(tmp_path) -> None:
    a, b = Ledger(tmp_path, "reward", "0"), Ledger(tmp_path, "reward", "1")
    a.record("0:0:0", True, reward=0.5)
    b.record("0:0:0", False, reward=0.5)  # a published it and wrote its line
    b.record("0:0:1", False, reward=0.25)  # its publisher died before its line
    a.record("0:0:1", False, reward=0.25)  # written by b since a last read
    a.close()
    b.close()
    assert sorted(_ids(tmp_path, "reward")) == ["0:0:0", "0:0:1"]
    assert _ids(tmp_path, "rollout") == []


class _Killed(Exception):
    pass


def test_a_worker_killed_between_publish_and_ledger_line_loses_no_line(tmp_path, redis_url: str,
                                                                         redis_client: redis.Redis,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    job, env = jpeg_reward_job(JOB, redis_url, tmp_path)
    g = torch.Generator().manual_seed(0)
    with TransferQueue(redis_client, JOB) as rollout:
        for i in range(N):
            meta = SampleMeta(sample_id=f"0:0:{i}", kind="train", step=0, group_id="0:0", prompt="a sign",
                              prompt_ids=[1], policy_version=0, noise_level=0.7, sde_type="sde", worker="rollout-0",
                              generated_at=1.0, rollout_seconds=1.0).model_dump()
            rollout.publish(rollout.streams.samples, meta, {"x0": torch.randn(4, 8, 8, generator=g)},
                            image=torch.randint(0, 256, (8, 8, 3), dtype=torch.uint8, generator=g),
                            done_kind="rollout")
    first = RewardService(job, env)
    record, calls = first._ledger.record, []

    def dies_after_the_second_publish(sample_id: str, published: bool, **fields: object) -> None:
        calls.append(sample_id)
        if len(calls) == 2:
            raise _Killed  # the second score is in Redis, its ledger line never written
        record(sample_id, published, **fields)

    monkeypatch.setattr(first._ledger, "record", dies_after_the_second_publish)
    msgs = first.queue.consume(first.queue.streams.samples, GROUP, env.worker_id, count=N, block_ms=0)
    with pytest.raises(_Killed):
        first.score_batch(msgs)
    first.close()
    assert _ids(tmp_path, "reward") == ["0:0:0"]

    successor = RewardService(job, env)  # the restarted worker: same id, its backlog
    try:
        backlog = successor.queue.recover(successor.queue.streams.samples, GROUP, env.worker_id)
        assert len(backlog) == N  # nothing was acknowledged
        successor.score_batch(backlog)
        assert successor.queue.stream_length(successor.queue.streams.scores) == N  # two were duplicates
    finally:
        successor.queue.cleanup()
        successor.close()
    assert sorted(_ids(tmp_path, "reward")) == [f"0:0:{i}" for i in range(N)]  # each once


def test_a_rollout_worker_writes_the_line_of_a_sample_its_predecessor_published(tmp_path,
                                                                                 redis_client: redis.Redis) -> None:
    """A restarted rollout worker skips samples already published (their `done:rollout` marker) and
    writes the line its predecessor, killed between publish and line, did not."""
    with TransferQueue(redis_client, JOB) as q:
        q.publish(q.streams.samples, {"sample_id": "0:0:0"}, {"x": torch.zeros(1)}, done_kind="rollout")
        worker = object.__new__(RolloutService)  # only the queue and the ledger: no model, no weight sync
        worker.queue, worker.ledger = q, Ledger(tmp_path, "rollout", "rollout-0")
        try:
            assert worker._published_before("0:0:0") is True
            assert worker._published_before("0:0:1") is False  # not published: generated
            assert worker._published_before("0:0:0") is True
        finally:
            worker.ledger.close()
            q.cleanup()
    assert _ids(tmp_path, "rollout") == ["0:0:0"]  # once
