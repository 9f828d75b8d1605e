"""A real `omnirl role reward` process on a real redis-server, SIGKILLed after it published a sample's score
and before it acknowledged the sample: its successor (the same worker restarted, or another replica once
`claimIdleSeconds` passed) acknowledges the sample without asking the judge again, writes the ledger line
its predecessor did not, and scores only the samples whose scores were not published.

Before the fix the successor scored every redelivered sample again (the judge's calls per sample 2, not 1;
the duplicate score was refused by `publish(done_kind="reward")`, so only the judge's work was doubled), and
a sample whose tensors the actor had trained and deleted meanwhile crashed the successor
(`MissingTensors` from `load_image`: exit 1, restarted into the same sample)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from tests.helpers import wait_until
from tests.reward.test_queue_reward_fetch import _sample
from tests.reward.test_reward_claims import _Judge, _manifest, serve_judge

from omnirl.transfer import TransferQueue

JOB, N = "claims", 4  # _manifest's job name
# imported first by the role processes: SIGKILL the process right after its `OMNIRL_KILL_AFTER`-th
# publish of a score returned (before its ledger line and its ack)
HOOK = """
import os, signal, sys
if "role" in sys.argv and "reward" in sys.argv and os.environ.get("OMNIRL_KILL_AFTER"):
    from omnirl.transfer import TransferQueue
    publish, left = TransferQueue.publish, [int(os.environ["OMNIRL_KILL_AFTER"])]
    def killing_publish(self, *args, **kwargs):
        entry = publish(self, *args, **kwargs)
        if kwargs.get("done_kind") == "reward":
            left[0] -= 1
            if left[0] == 0:
                os.kill(os.getpid(), signal.SIGKILL)
        return entry
    TransferQueue.publish = killing_publish
"""


@pytest.fixture()
def judge():
    """test_reward_claims' counting judge (the scorer protocol's HTTP twin), answering from the start."""
    yield from serve_judge(up=True)


def _reward(worker: str, manifest: Path, redis_url: str, out: Path, kill_after: int = 0) -> subprocess.Popen:
    env = {**os.environ, "OMNIRL_JOB_NAME": JOB, "OMNIRL_REDIS_URL": redis_url, "OMNIRL_WORKER_ID": worker,
           "OMNIRL_OUT": str(out), "OMNIRL_THREADS": "1", "OMNIRL_KILL_AFTER": str(kill_after or ""),
           "PYTHONPATH": os.pathsep.join([str(out / "hook"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "omnirl.cli", "role", "reward", "--job", str(manifest)], env=env,
                            stdout=subprocess.DEVNULL, stderr=(out / f"{worker}.log").open("a"))


def _ledger(out: Path) -> Counter:
    """sample id → lines in every reward ledger of the run directory."""
    return Counter(json.loads(line)["sample_id"] for p in (out / "ledger").glob("reward-*.jsonl")
                   for line in p.read_text().splitlines())


def _killed_after_two_scores(tmp_path: Path, redis_url: str, q: TransferQueue, port: int) -> Path:
    """N samples, all read and scored in one batch by reward-0, which dies right after publishing the
    second score: scores of 0:0:0 and 0:0:1 published, 0:0:1's ledger line missing, nothing acknowledged."""
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(HOOK)
    manifest = _manifest(tmp_path, port)
    g = torch.Generator().manual_seed(0)
    for i in range(N):
        meta, trajectory, image = _sample(i, g)
        q.publish(q.streams.samples, meta, trajectory, image=image, done_kind="rollout")
    first = _reward("reward-0", manifest, redis_url, tmp_path, kill_after=2)
    try:
        assert first.wait(120) == -9
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(30)
    assert _Judge.scored == {f"0:0:{i}": 1 for i in range(N)}
    assert q.stream_length(q.streams.scores) == 2 and q.pending_count(q.streams.samples, "reward") == N
    assert _ledger(tmp_path) == {"0:0:0": 1}
    return manifest


def _finish(q: TransferQueue, proc: subprocess.Popen, tmp_path: Path) -> None:
    """Wait for every score and ack, stop the job, check the scores and the ledger: each sample once."""
    try:
        def finished() -> bool:
            assert proc.poll() is None, f"the successor exited {proc.returncode}"  # before the fix: MissingTensors
            return q.stream_length(q.streams.scores) == N and not q.pending_count(q.streams.samples, "reward")

        wait_until(finished, "the successor to publish the other scores and ack every sample", 120)
        q.set_json("stop", True)
        assert proc.wait(60) == 0, proc.args
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    scores = q.consume(q.streams.scores, "c", "c", count=100, block_ms=0)
    assert Counter(m.meta["sample_id"] for m in scores) == {f"0:0:{i}": 1 for i in range(N)}
    assert _ledger(tmp_path) == {f"0:0:{i}": 1 for i in range(N)}
    q.cleanup()


def test_the_restarted_worker_does_not_score_a_published_sample_again(tmp_path, redis_url, redis_client, judge):
    q = TransferQueue(redis_client, JOB)
    manifest = _killed_after_two_scores(tmp_path, redis_url, q, judge.server_port)
    # the same worker id again (a restart-role restart, a pod's container restart): `recover` redelivers all N
    _finish(q, _reward("reward-0", manifest, redis_url, tmp_path), tmp_path)
    # 0:0:2 and 0:0:3 were scored but not published: scored again (nothing lost); before the fix 2 each for all
    assert _Judge.scored == {"0:0:0": 1, "0:0:1": 1, "0:0:2": 2, "0:0:3": 2}


def test_another_replica_acks_a_published_sample_whose_tensors_are_gone(tmp_path, redis_url, redis_client, judge):
    """The other replica reclaims the dead one's samples after claimIdleSeconds; meanwhile the scored ones
    were trained and their tensors deleted (the actor deletes them after training): acknowledged, no image read."""
    q = TransferQueue(redis_client, JOB)
    manifest = _killed_after_two_scores(tmp_path, redis_url, q, judge.server_port)
    q.delete_tensors([f"omnirl:{JOB}:tensors:0:0:{i}" for i in range(2)])
    _finish(q, _reward("reward-1", manifest, redis_url, tmp_path), tmp_path)
    assert _Judge.scored == {"0:0:0": 1, "0:0:1": 1, "0:0:2": 2, "0:0:3": 2}
