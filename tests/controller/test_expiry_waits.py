"""What the expired-tensor paths (`tests/controller/test_expired_train_val.py`) left waiting, and a sample's wait against
`spec.transferQueue.tensorTtlSeconds`.

- A `TrainLost` naming no sample (an actor rank could not read a key the leader then found): the controller
  skipped it and waited for the step forever (`omnirl run` with such an actor: no line for 2 min 20 s, every role
  beating, until killed). Now the actor reads the batch again and never publishes one, and the controller, given
  one (an older actor), looks at the batch's keys itself: regenerates the gone ones' groups, or hands the same
  batch again, at most `REASK_LIMIT` times, then fails the job naming the cause.
- A validation round whose every sample was missing is run once more for the same policy version, prompts and
  noise (`attempts: 2` on its line); a second empty round has null means.
- The actor measures how long its batches' tensors had lived (`TransferQueue.ages`: Redis's PTTL) when it read
  them and when a checkpoint covered them; the controller warns once past half the TTL, naming the field and a
  value; `omnirl validate` prints the step time the TTL and `checkpoint.everySteps` allow.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from tests.helpers import refill_shapes, trained_sample_ids

from omnirl.api.loader import job_from_dict
from omnirl.api.messages import GenerateRequest, HeldOutCohort, ScoreMeta, TrainDone, TrainItem, TrainLost, TrainRequest
from omnirl.api.runtime import RoleEnv
from omnirl.transfer import TransferQueue

ROOT = Path(__file__).resolve().parents[2]
PATHS = [str(ROOT / "services"), str(ROOT / "operator"), str(ROOT)]


def _doc(name: str, steps: int = 1, **spec_extra) -> dict:
    """A tiny FlowGRPO job: `steps` steps of 2 prompts × 3 samples, 4 sampling steps, a checkpoint every step."""
    doc = yaml.safe_load((ROOT / "examples" / "ocr-flowgrpo.yaml").read_text())
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    spec["data"] = {"trainPrompts": str(ROOT / "examples/prompts/ocr-train.txt")}
    spec.pop("validation")
    spec["algorithm"].update(steps=steps, groupSize=3, promptsPerStep=2, sampling={"numSteps": 4},
                             optimizer={"learningRate": 1e-4, "microBatchSize": 6, "updatesPerStep": 1})
    spec["algorithm"]["flowGrpo"]["window"] = {"size": 2, "range": [0, 3]}
    spec["checkpoint"] = {"everySteps": 1, "keep": 1}
    spec["transferQueue"] = {"claimIdleSeconds": 5, "tensorTtlSeconds": 60}
    spec["failurePolicy"] = {"maxRestarts": 0, "progressDeadlineSeconds": 60}  # any crash of a role ends the run
    spec.update(spec_extra)
    return doc


# --------------------------------------------------------------------------------------- the controller (in-process)

def test_a_train_lost_naming_no_sample_makes_the_controller_look_at_the_batch_keys(tmp_path, redis_url, redis_client):
    """`_wait_trained` returns a `TrainLost` naming no sample (before: skipped as an earlier batch's answer, and the
    step waited forever). With every key in Redis the same batch is handed again, `REASK_LIMIT` times, then the job
    fails naming the cause; with a key gone, a `TrainLost` naming that sample comes back, to regenerate its group;
    once the actor has trained the step (`kv:actor_state`), nothing: its `TrainDone` follows."""
    from omnirl.controller.loop import REASK_LIMIT, Controller, JobFailed

    name = "noname"
    doc = _doc(name)
    env = RoleEnv(job_name=name, redis_url=redis_url, weight_sync_host="127.0.0.1", weight_sync_port=1,
                  worker_id="controller-0", out_dir=str(tmp_path))
    c = Controller(job_from_dict(doc), env)
    q = TransferQueue(redis_client, name)
    items = [TrainItem(sample_id=f"0:5:{i}", group_id="0:5", prompt_ids=[1], advantage=0.0,
                       tensor_key=f"omnirl:{name}:tensors:0:5:{i}", noise_level=0.7, sde_type="cps") for i in range(3)]
    for item in items:
        q.redis.set(item.tensor_key, b"x")
    req = TrainRequest(step=0, policy_version=0, items=items)
    q.redis.hset(f"omnirl:{name}:kv:trainreqs", "0", json.dumps({"request": req.model_dump(), "stats": {}}))
    q.ensure_group(q.streams.control, "t")
    for stream in (q.streams.scores, q.streams.control):
        q.ensure_group(stream, "controller")
    empty = c.lost[0] = TrainLost(step=0, samples=[], reason="0 of 3 tensor keys were gone")
    q.publish(q.streams.control, TrainDone(step=0, policy_version=1, metrics={}).model_dump())  # a later answer
    assert c._wait_trained(0, req) is empty  # before: skipped, and (without that TrainDone) waited forever
    q.consume(q.streams.control, "t", "t", count=10, block_ms=0)
    assert [c._name_lost(empty, req) for _ in range(REASK_LIMIT)] == [None] * REASK_LIMIT
    handed = [TrainRequest.model_validate(m.meta) for m in q.consume(q.streams.control, "t", "t", count=10, block_ms=0)]
    assert handed == [req] * REASK_LIMIT
    with pytest.raises(JobFailed, match=r"^step 0: the actor reported its batch lost 4 times naming no sample, but "
                       r"Redis holds every tensor key of it \(0 of 3 tensor keys were gone\): an actor rank cannot read "
                       r"what the leader reads; check that every actor rank reaches spec.transferQueue.redisUrl"):
        c._name_lost(empty, req)
    q.redis.delete(items[1].tensor_key)
    named = c._name_lost(empty, req)
    assert named == TrainLost(step=0, samples=["0:5:1"], reason=(
        f"1 of 3 tensor keys of step 0's batch were gone (e.g. omnirl:{name}:tensors:0:5:1): expired after "
        "spec.transferQueue.tensorTtlSeconds (60 s), or deleted"))
    assert not q.consume(q.streams.control, "t", "t", count=10, block_ms=0)  # nothing handed for that one
    # an earlier copy's answer, the step trained meanwhile (its checkpoint deleted the keys): wait for its TrainDone
    q.set_json("actor_state", {"step": 0, "policy_version": 1, "data_position": [0, 2]})
    assert c._name_lost(empty, req) is None
    assert not q.consume(q.streams.control, "t", "t", count=10, block_ms=0)
    c.close()
    q.cleanup()


LOST_DELAY_S = 1.0  # the all-missing first attempt's time, in the validation test below


def test_an_all_missing_validation_round_runs_once_more_for_the_same_policy_version(tmp_path, redis_url,
                                                                                    redis_client, caplog):
    """`Controller._validate` with a stand-in for the rollout and reward roles (a thread on the requests stream).
    Every sample of the first round comes back lost: the round is published again under new ids (`…a1`) with the
    same noise seeds and the line is the second round's, `attempts` 2, at the same policy version (before: n=0 and
    a null mean, not run again). Both rounds lost: one line with null means, n 0, `attempts` 2, and a warning naming
    the TTL field; the job goes on. The rerun line's `val_seconds` is the whole round's, both attempts: the first
    attempt's lost scores come `LOST_DELAY_S` late (before: 0.02 s, the rerun's alone, for a round of 1.04 s)."""
    from omnirl.controller.loop import Controller

    name = "valagain"
    doc = _doc(name, validation={"everySteps": 1, "numSteps": 4, "maxPrompts": 2})
    doc["spec"]["data"]["validationPrompts"] = str(ROOT / "examples/prompts/ocr-heldout.txt")
    env = RoleEnv(job_name=name, redis_url=redis_url, weight_sync_host="127.0.0.1", weight_sync_port=1,
                  worker_id="controller-0", out_dir=str(tmp_path))
    c = Controller(job_from_dict(doc), env)
    c.version = 3
    q = TransferQueue(redis_client, name)
    for stream in (q.streams.scores, q.streams.control):
        q.ensure_group(stream, "controller")
    q.ensure_group(q.streams.requests, "roles")
    seen: list[GenerateRequest] = []
    lose, stop = {"rounds": 1}, threading.Event()

    def roles() -> None:  # rollout + reward: a sample lost in the first `lose` rounds of a step, else scored
        with TransferQueue.from_url(redis_url, name) as rq:
            while not stop.is_set():
                for m in rq.consume(rq.streams.requests, "roles", "r", count=10, block_ms=50):
                    for req in HeldOutCohort.model_validate(m.meta).requests:  # a round travels in cohorts
                        seen.append(req)
                        index = int(req.group_id.split(":")[1])
                        lost = sum(r.step == req.step and r.group_id == req.group_id for r in seen) <= lose["rounds"]
                        score = ScoreMeta(sample_id=req.samples[0].sample_id, kind="val", step=req.step,
                                          group_id=req.group_id, policy_version=3, generated_at=1.0, scored_at=2.0,
                                          **(dict(failed=True, lost=True, reason="gone") if lost else
                                             dict(reward=0.25 * (index + 1), rewards={"ocr": 0.25 * (index + 1)})))
                        if lost and req.step == 5:  # the first attempt takes LOST_DELAY_S before its scores come
                            time.sleep(LOST_DELAY_S / 2)
                        tensors = None if lost else {"x0": torch.zeros(1)}
                        image = None if lost else torch.full((8, 16, 3), 255, dtype=torch.uint8)
                        rq.publish(rq.streams.scores, score.model_dump(), tensors, image=image)
                    rq.ack(rq.streams.requests, "roles", [m.id])

    thread = threading.Thread(target=roles, daemon=True)
    thread.start()
    try:
        with caplog.at_level(logging.WARNING, logger="omnirl.controller"):
            t0 = time.monotonic()
            c._validate(5)
            took = time.monotonic() - t0
            lose["rounds"] = 2
            c._validate(6)
    finally:
        stop.set()
        thread.join(10)
    ids = [(r.step, r.samples[0].sample_id, r.samples[0].seed) for r in seen]
    assert [i[:2] for i in ids] == [(5, "val5:0:0"), (5, "val5:1:0"), (5, "val5:0:0a1"), (5, "val5:1:0a1"),
                                    (6, "val6:0:0"), (6, "val6:1:0"), (6, "val6:0:0a1"), (6, "val6:1:0a1")]
    assert ids[0][2] == ids[2][2] != ids[1][2] == ids[3][2]  # the same noise per prompt
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    got = [(r["step"], r["policy_version"], r["n"], r["missing"], r["attempts"], r["val_reward_mean"]) for r in rows]
    assert got == [(5, 3, 2, 0, 2, 0.375), (6, 3, 0, 2, 2, None)]
    assert LOST_DELAY_S <= rows[0]["val_seconds"] <= took, (rows[0]["val_seconds"], took)  # both attempts
    warned = [r.getMessage() for r in caplog.records]
    assert "validation at step 5: all 2 samples missing: running the round again for policy v3 (the same prompts and " \
        "noise)" in warned, warned
    assert "validation at step 6: all 2 samples missing in 2 rounds: its line has no reward (null); raise spec." \
        "transferQueue.tensorTtlSeconds above the longest a validation round takes" in warned, warned
    c.close()
    q.cleanup()


# --------------------------------------------------------------------------------------- ages and the warnings

def test_ages_come_from_redis_and_the_watch_warns_once_per_kind_past_half_the_ttl(redis_client, caplog):
    """`TransferQueue.ages`: TTL − PTTL (a key with 20 s left of 60 lived 40 s), None for a gone key. `TtlWatch`:
    silent at 29 s of 60, one warning each for the batch (41 s) and the replay (50 s) naming the field and a TTL of
    4 × the wait, nothing more for a later step; `budget_line`: the step time the TTL and the checkpoint interval
    allow (fully-async adds the step generated ahead)."""
    from omnirl.controller.ttl import TtlWatch, budget_line

    q = TransferQueue(redis_client, "ages", tensor_ttl_s=60)
    q.redis.set("omnirl:ages:tensors:a", b"x", px=20_000)
    q.redis.set("omnirl:ages:tensors:b", b"x", px=60_000)
    a, gone, b = q.ages(["omnirl:ages:tensors:a", "omnirl:ages:tensors:gone", "omnirl:ages:tensors:b"])
    assert 39.9 <= a <= 40.5 and gone is None and 0 <= b <= 0.5

    doc = _doc("ttlwatch", steps=100)
    doc["spec"]["checkpoint"]["everySteps"] = 4
    spec = job_from_dict(doc).spec
    watch = TtlWatch(spec)
    with caplog.at_level(logging.WARNING, logger="omnirl.controller"):
        watch.trained(2, {"batch_tensor_age_seconds": 29.0})
        assert not caplog.records
        watch.trained(3, {"batch_tensor_age_seconds": 41.0, "replay_tensor_age_seconds": 50.0})
        watch.trained(7, {"batch_tensor_age_seconds": 59.0, "replay_tensor_age_seconds": 59.0})
    assert [r.getMessage() for r in caplog.records] == [
        "step 3: the batch's oldest sample had waited 41 s when the actor read it, 68% of spec.transferQueue."
        "tensorTtlSeconds (60 s); past it the step is not trained and its groups are generated again: raise "
        "tensorTtlSeconds (e.g. to 180)",
        "step 3: the checkpoint covered a batch whose oldest sample was 50 s old, 83% of spec.transferQueue."
        "tensorTtlSeconds (60 s); an actor restarted before a checkpoint that late cannot replay its batch (exit 4): "
        "lower spec.checkpoint.everySteps (4) or raise tensorTtlSeconds (e.g. to 240)"]
    assert budget_line(spec) == (
        "tensors: transferQueue.tensorTtlSeconds 60 s must outlive checkpoint.everySteps (4) for an actor restart to "
        "replay a batch: keep a training step under 15 s (the run warns past 50% of the TTL)")
    doc["spec"]["checkpoint"]["everySteps"] = 0
    doc["spec"]["pipeline"] = {"mode": "fully-async", "maxStaleness": 1}
    assert budget_line(job_from_dict(doc).spec) == (
        "tensors: transferQueue.tensorTtlSeconds 60 s must outlive the whole run (checkpoint.everySteps 0: 100 steps) + "
        "1 step generated ahead (fully-async) for an actor restart to replay a batch: keep a training step under 1 s "
        "(the run warns past 50% of the TTL)")
    q.cleanup()


# --------------------------------------------------------------------------------------- omnirl run (processes)

# imported first by the role processes (sitecustomize on PYTHONPATH). Actor: step 0's first read of a key fails as if
# a rank had not seen it (it is there), and that key is given 20 s left of its 60 (as if it had waited 40 s); step
# 1's first batch is reported lost naming no sample (an actor before this fix). Reward: the first round of the first
# validation finds every sample's tensors gone.
HOOKS = '''
import sys
if "role" in sys.argv and "actor" in sys.argv:
    from omnirl.actor import service
    from omnirl.api.messages import TrainLost
    from omnirl.transfer import MissingTensors
    load, load_batch, hit = service.ActorService._load, service.ActorService._load_batch, []
    def flaky_load(self, item):
        if "load" not in hit and item.sample_id.startswith("0:"):
            hit.append("load")
            self.queue.redis.pexpire(item.tensor_key, 20_000)
            print(f"test hook: a rank did not see {item.tensor_key}", file=sys.stderr, flush=True)
            raise MissingTensors(item.tensor_key)
        return load(self, item)
    def empty_lost(self, req):
        if "batch" not in hit and req.step == 1:
            hit.append("batch")
            print("test hook: step 1's batch reported lost naming no sample", file=sys.stderr, flush=True)
            raise service.BatchLost(TrainLost(step=1, samples=[], reason="test hook"))
        return load_batch(self, req)
    service.ActorService._load, service.ActorService._load_batch = flaky_load, empty_lost
if "role" in sys.argv and "reward" in sys.argv:
    from omnirl.transfer import TransferQueue
    consume = TransferQueue.consume
    def expiring_consume(self, stream, *args, **kwargs):
        msgs = consume(self, stream, *args, **kwargs)
        for m in msgs:
            sid = m.meta.get("sample_id", "")
            if stream == self.streams.samples and sid.startswith("val0:") and "a" not in sid.rsplit(":", 1)[1]:
                self.delete_tensors([m.tensor_key])
                print(f"test hook: deleted the tensors of {sid}", file=sys.stderr, flush=True)
        return msgs
    TransferQueue.consume = expiring_consume
'''


@pytest.mark.slow  # 30-40 s on 2 busy cores: a whole run of 2 steps and 2 validation rounds (3 with the rerun)
def test_omnirl_run_through_a_train_lost_naming_no_sample_and_an_empty_validation_round(tmp_path):
    """`omnirl run` (real redis-server and role processes). Step 0: a rank's read of a key fails though the key is
    there: the actor reads the batch again (one warning), no `TrainLost` (before: one naming no sample, and the
    controller waited forever). Step 1: `TrainLost` naming no sample: the controller finds every key in Redis and
    hands the same batch again (one warning). Nothing regenerated: 2 × 6 samples trained, no refills. The key left
    20 s of 60 makes the batch (40 s) and the replay warnings, once each. Validation at step 0: every sample gone in
    the first round, run again: n=2, attempts 2 (before: n=0, null mean, no rerun)."""
    from omnirl.evaluation.ledger import check_ledger

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOKS)
    doc = _doc("nameless", steps=2, validation={"everySteps": 2, "numSteps": 4, "maxPrompts": 2})
    doc["spec"]["data"]["validationPrompts"] = str(ROOT / "examples/prompts/ocr-heldout.txt")
    job, out = tmp_path / "job.yaml", tmp_path / "out"
    job.write_text(yaml.safe_dump(doc))
    done = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", str(job), "--no-ray", "--device", "cpu",
                           "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), *PATHS])})
    console = done.stdout + done.stderr
    assert done.returncode == 0, console[-3000:]
    lines = console.splitlines()
    assert sum("test hook: deleted the tensors of val0:" in line for line in lines) == 2, console[-3000:]
    warned = [line.split(" WARNING ", 1)[1] for line in lines if " WARNING " in line]
    assert "omnirl.actor: step 0: a rank could not read tensor keys of the batch that Redis holds (none is absent "\
        "now): reading the batch again" in warned, warned
    assert "omnirl.controller: step 1: the actor reported its batch lost naming no sample, but Redis holds every " \
        "tensor key of it: handing the same batch again (1 of 3)" in warned, warned
    batch = [w for w in warned if "the batch's oldest sample had waited" in w]
    assert len(batch) == 1 and batch[0].startswith("omnirl.controller: step 0: the batch's oldest sample had waited 4")
    assert "% of spec.transferQueue.tensorTtlSeconds (60 s); past it the step is not trained" in batch[0], batch
    replay = [w for w in warned if "the checkpoint covered a batch" in w]
    assert len(replay) == 1 and "cannot replay its batch (exit 4): raise tensorTtlSeconds (e.g. to " in replay[0], replay
    assert "omnirl.controller: validation at step 0: all 2 samples missing: running the round again for policy v0 " \
        "(the same prompts and noise)" in warned, warned
    assert not any("regenerating" in line or "step 0 not trained" in line for line in lines), console[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    vals = [(v["step"], v["policy_version"], v["n"], v["missing"], v.get("attempts")) for v in rows
            if v["event"] == "validation"]
    assert vals == [(0, 0, 2, 0, 2), (2, 2, 2, 0, None)]
    assert all(v["val_reward_mean"] is not None for v in rows if v["event"] == "validation")
    steps = {r["step"]: r for r in rows if r["event"] == "step"}
    assert 39 <= steps[0]["batch_tensor_age_seconds"] < 60 and steps[0]["replay_tensor_age_seconds"] >= 39
    assert refill_shapes(out) == {0: (6, 2, 0, 0), 1: (6, 2, 0, 0)}
    counts = check_ledger(out, total_steps=2, group_size=3, prompts_per_step=2)
    assert counts.samples() == (12, 12, 12, 0, 0, 0), counts.problems
    assert len(trained_sample_ids(out)) == 12
