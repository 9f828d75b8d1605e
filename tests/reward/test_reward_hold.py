"""A scorer that does not answer (a judge restarting) fails no sample at once: a real RewardService
against a real redis-server holds the samples and scores them when the judge (`omnirl scorer serve`,
a real process) comes back; past `failurePolicy.scorerOutageSeconds` they fail with the reason."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import redis
import torch
import yaml
from tests.reward.test_queue_reward_fetch import _sample

from omnirl.api.loader import job_from_dict
from omnirl.api.messages import ScoreMeta
from omnirl.api.runtime import RoleEnv
from omnirl.reward.jpeg import JPEGCompressibilityScorer
from omnirl.reward.service import GROUP, RewardService
from omnirl.transfer import TransferQueue
from omnirl.transfer.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
JOB, N = "hold", 3


def service(tmp_path: Path, redis_url: str, redis_client: redis.Redis, port: int, deadline_s: float,
            more: tuple = (), required: bool = True, judge: dict | None = None, policy: dict | None = None
            ) -> tuple[RewardService, list, list[np.ndarray]]:
    """A reward worker whose rewards are `judge` (default: an http judge on `port`) and `more`, and
    the messages of N samples; `policy`: more `failurePolicy` fields."""
    doc = yaml.safe_load((ROOT / "examples" / "ocr-flowgrpo.yaml").read_text())
    doc["metadata"]["name"] = JOB
    judge = judge or {"name": "judge", "kind": "http", "url": f"http://127.0.0.1:{port}/v1/score",
                      "required": required, "params": {"maxRetries": 0}}
    doc["spec"]["reward"] = [judge, *more]
    doc["spec"]["failurePolicy"] = {"scorerOutageSeconds": deadline_s, **(policy or {})}
    env = RoleEnv(job_name=JOB, redis_url=redis_url, weight_sync_host="127.0.0.1", weight_sync_port=0,
                  worker_id="reward-0", out_dir=str(tmp_path))
    g = torch.Generator().manual_seed(0)
    samples = [_sample(i, g) for i in range(N)]
    with TransferQueue(redis_client, JOB) as rollout:
        rollout.cleanup()
        for meta, trajectory, image in samples:
            rollout.publish(rollout.streams.samples, meta, trajectory, image=image, done_kind="rollout")
    worker = RewardService(job_from_dict(doc), env)
    msgs = worker.queue.consume(worker.queue.streams.samples, GROUP, env.worker_id, count=N, block_ms=0)
    assert len(msgs) == N
    return worker, msgs, [im.numpy() for _, _, im in samples]


def published(redis_client: redis.Redis) -> list[ScoreMeta]:
    with TransferQueue(redis_client, JOB) as q:
        return [ScoreMeta.model_validate(m.meta) for m in q.consume(q.streams.scores, "c", "c", count=10, block_ms=0)]


class _Held(logging.Handler):
    """Sets `event` when the worker says it holds samples; keeps every message."""

    def __init__(self) -> None:
        super().__init__()
        self.event = threading.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        if "samples held" in record.getMessage():
            self.event.set()


def test_samples_wait_for_a_judge_that_comes_back(tmp_path, redis_url, redis_client):
    port = free_port()
    worker, msgs, images = service(tmp_path, redis_url, redis_client, port, deadline_s=600)
    held = _Held()
    logging.getLogger("omnirl.reward").addHandler(held)
    judge = None
    try:
        thread = threading.Thread(target=worker.score_batch, args=(msgs,))
        thread.start()
        assert held.event.wait(120), "the worker never held the samples"
        assert published(redis_client) == []  # nothing failed while the judge is away
        judge = subprocess.Popen([sys.executable, "-m", "omnirl.cli", "scorer", "serve", "--reward", "jpeg",
                                  "--protocol", "http", "--port", str(port), "--host", "127.0.0.1"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        thread.join(300)
        assert not thread.is_alive()
    finally:
        logging.getLogger("omnirl.reward").removeHandler(held)
        worker.terminate()
        worker.close()
        if judge is not None:
            judge.terminate()
            judge.wait(30)
    scores = published(redis_client)
    expected = JPEGCompressibilityScorer().score(np.stack(images), ["a sign"] * N, [s.sample_id for s in scores])
    assert [s.failed for s in scores] == [False] * N
    np.testing.assert_allclose([s.reward for s in scores], expected, rtol=1e-6)


def test_a_judge_away_past_the_deadline_fails_the_samples_with_the_reason(tmp_path, redis_url, redis_client):
    worker, msgs, _ = service(tmp_path, redis_url, redis_client, free_port(), deadline_s=0.5)
    try:
        worker.score_batch(msgs)
    finally:
        worker.close()
    scores = published(redis_client)
    assert len(scores) == N and all(s.failed and s.reward is None for s in scores)
    assert "unreachable: [Errno 111] Connection refused" in scores[0].reason, scores[0].reason



def test_a_judge_slower_than_its_timeout_is_not_held_and_the_worker_says_so_at_once(tmp_path, redis_url,
                                                                                    redis_client):
    """A VLM judge that answers, but in 1 s with `timeoutSeconds: 0.3`: waiting the 600 s of
    `scorerOutageSeconds` would not make it faster, so nothing is held; the samples are published
    failed with the reason naming the field and the time one request took, and the worker logs it
    with the first failure (before, every batch waited 600 s and then said "timed out")."""
    server = subprocess.Popen([sys.executable, str(ROOT / "tests" / "judge_server.py"), "--delay", "1"],
                              stdout=subprocess.PIPE, text=True)
    logs, thread = _Held(), None
    logging.getLogger("omnirl.reward").addHandler(logs)
    try:
        url = f"http://127.0.0.1:{int(server.stdout.readline().split()[-1])}/v1"
        judge = {"name": "judge", "kind": "vlm", "url": url, "timeoutSeconds": 0.3,
                 "params": {"model": "judge", "template": "rate", "maxRetries": 0}}
        worker, msgs, _ = service(tmp_path, redis_url, redis_client, 0, deadline_s=600, judge=judge,
                                  more=({"name": "jpeg", "kind": "jpeg", "required": False},))

        def score() -> None:
            worker.score_batch(msgs)
            logs.event.set()  # done: the same event as "held", so a held batch fails the test at once

        thread = threading.Thread(target=score)
        thread.start()
        assert logs.event.wait(120), "the batch was neither held nor scored"
    finally:
        logging.getLogger("omnirl.reward").removeHandler(logs)
        if thread is not None:
            worker.terminate()  # a held batch returns, unacknowledged
            thread.join(60)
            worker.close()
        server.terminate()
        server.wait(30)
    assert not [m for m in logs.messages if "samples held" in m], logs.messages
    scores = published(redis_client)
    assert len(scores) == N and all(s.failed and s.reward is None for s in scores)
    assert scores[0].reason.startswith(f"judge: {url} is up (it listed its models in "), scores[0].reason
    assert "slower than spec.reward[0].timeoutSeconds 0.3: 1 attempt(s) timed out and one request took " in \
        scores[0].reason
    (line,) = [m for m in logs.messages if m.startswith("reward ")]  # the judge's; jpeg, not summed, failed nothing
    assert line.startswith("reward judge failed a sample") and "set spec.reward[0].timeoutSeconds above that" in line


def test_a_failing_non_required_judge_is_left_out_and_logged_once(tmp_path, redis_url, redis_client):
    """Beside a required JPEG reward, a dead non-required judge holds nothing: each sample gets its
    JPEG score, and the console gets the judge's reason once for the whole batch."""
    worker, msgs, images = service(tmp_path, redis_url, redis_client, free_port(), deadline_s=600, required=False,
                                   more=({"name": "jpeg", "kind": "jpeg"},))
    logs = _Held()
    logging.getLogger("omnirl.reward").addHandler(logs)
    try:
        worker.score_batch(msgs[:1])
        worker.score_batch(msgs[1:])
    finally:
        logging.getLogger("omnirl.reward").removeHandler(logs)
        worker.close()
    scores = published(redis_client)
    expected = JPEGCompressibilityScorer().score(np.stack(images), ["a sign"] * N, [s.sample_id for s in scores])
    assert [s.rewards for s in scores] == [{"jpeg": pytest.approx(float(e))} for e in expected]
    assert not logs.event.is_set()
    (line,) = [m for m in logs.messages if "judge" in m]
    assert line.startswith("reward judge (required: false) failed, left out of the sample's reward: judge: "
                           "http://127.0.0.1:") and "Connection refused" in line and "component_missing_judge" in line


def test_a_reward_worker_refuses_a_model_its_judge_does_not_serve_but_not_a_judge_still_away(
        tmp_path, redis_url, redis_client):
    """On Kubernetes nothing runs `omnirl run`'s pre-flight: the reward worker asks the judge itself
    and a model it does not serve is a configuration error (exit 4, the RLJob Failed with the line);
    a judge that does not answer yet (still loading) is not: its samples wait for it."""
    from omnirl.api.errors import ConfigError

    server = subprocess.Popen([sys.executable, str(ROOT / "tests" / "judge_server.py")], stdout=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{int(server.stdout.readline().split()[-1])}/v1"
        for judge_url, model, refused in [(url, "qwen", True), (url, "judge", False),
                                          (f"http://127.0.0.1:{free_port()}/v1", "qwen", False)]:
            doc = yaml.safe_load((ROOT / "examples" / "ocr-flowgrpo.yaml").read_text())
            doc["metadata"]["name"] = JOB
            doc["spec"]["reward"] = [{"name": "judge", "kind": "vlm", "url": judge_url,
                                      "params": {"model": model, "template": "read-text"}}]
            env = RoleEnv(job_name=JOB, redis_url=redis_url, weight_sync_host="127.0.0.1", weight_sync_port=0,
                          worker_id="reward-0", out_dir=str(tmp_path))
            if refused:
                with pytest.raises(ConfigError, match=r"^spec.reward\[0\].params.model: 'qwen' is not served by "):
                    RewardService(job_from_dict(doc), env)
            else:
                RewardService(job_from_dict(doc), env).close()
    finally:
        server.terminate()
        server.wait(30)


def test_validation_reports_each_component_and_its_misses_whatever_sample_0_got(tmp_path, redis_url, redis_client):
    """A non-required judge that failed on the first validation sample only: its mean is over the
    samples it scored and its misses are counted (the components were read from sample 0 alone, so
    `val_reward_judge` vanished); one that failed on all is None with every sample missing."""
    from omnirl.controller.validation import Validator

    (tmp_path / "val.txt").write_text('"12"\n"345"\n"6789"\n')
    doc = yaml.safe_load((ROOT / "examples" / "ocr-flowgrpo.yaml").read_text())
    doc["spec"]["data"] = {"trainPrompts": str(ROOT / "examples/prompts/ocr-train.txt"),
                           "validationPrompts": str(tmp_path / "val.txt")}
    doc["spec"]["reward"] = [{"name": "ocr", "kind": "ocr"}, {"name": "judge", "kind": "jpeg", "required": False},
                             {"name": "gone", "kind": "jpeg", "required": False}]
    spec = job_from_dict(doc).spec
    parts = [{"ocr": 0.5}, {"ocr": 0.7, "judge": 0.2}, {"ocr": 0.9, "judge": 0.4}]
    with TransferQueue(redis_client, JOB) as q:
        validator = Validator(q, spec, lambda p: [1], tmp_path, nonce=7)
        validator.publish(at_step=0, version=0)
        for i in range(len(parts)):
            q.publish(q.streams.samples, {"sample_id": f"s{i}"}, {"x0": torch.zeros(1)},
                      image=torch.zeros(8, 16, 3, dtype=torch.uint8))
        msgs = q.consume(q.streams.samples, "v", "v", count=10, block_ms=0)
        for i, (msg, rewards) in enumerate(zip(msgs, parts, strict=True)):
            validator.record(ScoreMeta(sample_id=f"val0:{i}:7", kind="val", step=0, group_id=f"val0:{i}",
                                       policy_version=0, reward=sum(rewards.values()), rewards=rewards,
                                       generated_at=0.0, scored_at=0.0), msg.tensor_key)
        summary = validator.finish()
        q.cleanup()
    assert summary["val_reward_ocr"] == pytest.approx(0.7) and summary["val_component_missing_ocr"] == 0
    assert summary["val_reward_judge"] == pytest.approx(0.3) and summary["val_component_missing_judge"] == 1
    assert summary["val_reward_gone"] is None and summary["val_component_missing_gone"] == 3
