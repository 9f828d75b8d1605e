"""Tensors that expire (`spec.transferQueue.tensorTtlSeconds`) or are deleted before the actor or a validation
round reads them: the job goes on.

- The actor: a `TrainRequest` naming samples whose tensor keys are gone is not trained; the actor publishes
  `TrainLost` (one warning line naming the TTL field and the fix), the controller marks those samples failed in
  the step's book (stored with the batch in `kv:trainreqs`) and its refill path regenerates their groups, then
  hands the step again. A restarted actor that must replay a step its predecessor trained, from a batch whose
  tensors are gone, exits 4 with one line (the update cannot be rebuilt; restarting cannot help).
- Validation: a sample whose tensors were gone (the reward role's `lost` score, or the image gone when the round
  is summarised) is left out of the means and counted: `n` and `missing` in the `validation` line.

Before the fix, measured with `omnirl run` (3 steps of 2 × 3, fully-async, tensorTtlSeconds 60, the actor
SIGSTOPped 80 s while step 1's batch waited): `MissingTensors` in the actor, restart-job twice (the restarted
actor met it again replaying step 0), exit 1, 1 step line, final weights hold no step; and the reward role
SIGSTOPped 80 s across a validation round: `validation sample val1:0:0 could not be scored`, the job failed, exit 3.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from tests.helpers import refill_shapes, trained_sample_ids

from omnirl.api.exits import CONFIG_ERROR_EXIT
from omnirl.api.loader import job_from_dict
from omnirl.api.messages import GenerateRequest, SampleSeed, ScoreMeta, TrainItem, TrainRequest
from omnirl.controller.groups import StepBook
from omnirl.controller.validation import SampleUnscored, Validator
from omnirl.transfer import TransferQueue

ROOT = Path(__file__).resolve().parents[2]
PATHS = [str(ROOT / "services"), str(ROOT / "operator"), str(ROOT)]


def _job(tmp_path: Path, name: str, **spec_extra) -> Path:
    """A tiny FlowGRPO job: 1 step of 2 prompts × 3 samples, 4 sampling steps."""
    doc = yaml.safe_load((ROOT / "examples" / "ocr-flowgrpo.yaml").read_text())
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    spec["data"] = {"trainPrompts": str(ROOT / "examples/prompts/ocr-train.txt")}
    spec.pop("validation")
    spec["algorithm"].update(steps=1, groupSize=3, promptsPerStep=2, sampling={"numSteps": 4},
                             optimizer={"learningRate": 1e-4, "microBatchSize": 6, "updatesPerStep": 1})
    spec["algorithm"]["flowGrpo"]["window"] = {"size": 2, "range": [0, 3]}
    spec["checkpoint"] = {"everySteps": 1, "keep": 1}
    spec["transferQueue"] = {"claimIdleSeconds": 5}
    spec["failurePolicy"] = {"maxRestarts": 0, "progressDeadlineSeconds": 60}  # any crash of a role ends the run
    spec.update(spec_extra)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


# --------------------------------------------------------------------------------------- validation (in-process)

def _val_spec(tmp_path: Path):
    (tmp_path / "val.txt").write_text('"12"\n"345"\n"6789"\n')
    doc = yaml.safe_load((ROOT / "examples" / "ocr-flowgrpo.yaml").read_text())
    doc["spec"]["data"] = {"trainPrompts": str(ROOT / "examples/prompts/ocr-train.txt"),
                           "validationPrompts": str(tmp_path / "val.txt")}
    return job_from_dict(doc).spec


def test_a_validation_round_with_gone_samples_reports_the_rest_and_counts_the_missing(tmp_path, redis_client, caplog):
    """Three held-out samples: val0:0 scored 0.5; val0:1 a `lost` score (the reward role found its image gone);
    val0:2 scored 0.9 but its image expires before the round is summarised. The round's line: the mean over
    val0:0 alone (0.5, n=1), missing=2, one warning naming both and the TTL field; no exception (before: the
    lost score raised SampleUnscored, a JobFailed; the gone image, MissingTensors)."""
    spec = _val_spec(tmp_path)
    job = "valgone"
    with TransferQueue(redis_client, job) as q:
        validator = Validator(q, spec, lambda p: [1], tmp_path, nonce=3)
        with caplog.at_level(logging.INFO, logger="omnirl.controller"):
            validator.publish(at_step=4, version=2)
        # the round says when it starts (the CPU demo's first one ran 300 s on a busy box without a line)
        assert [r.getMessage() for r in caplog.records] == [
            "validation after 4 training steps (v2): sampling 3 held-out prompts, 20 ODE steps each"]
        caplog.clear()
        for i in range(3):
            q.publish(q.streams.samples, {"sample_id": f"s{i}"}, {"x0": torch.zeros(1)},
                      image=torch.full((8, 16, 3), 255, dtype=torch.uint8))
        msgs = q.consume(q.streams.samples, "v", "v", count=10, block_ms=0)
        scores = [dict(reward=0.5, rewards={"ocr": 0.5}),
                  dict(reward=None, failed=True, lost=True, reason="omnirl:valgone:images:x expired before it was read"),
                  dict(reward=0.9, rewards={"ocr": 0.9})]
        for i, (msg, kw) in enumerate(zip(msgs, scores, strict=True)):
            validator.record(ScoreMeta(sample_id=f"val4:{i}:3", kind="val", step=4, group_id=f"val4:{i}",
                                       policy_version=2, generated_at=time.time() - 70, scored_at=0.0, **kw),
                             msg.tensor_key)
        q.delete_tensors([msgs[1].tensor_key, msgs[2].tensor_key])  # val4:2's image expires before finish
        assert validator.complete
        with caplog.at_level(logging.WARNING, logger="omnirl.controller"):
            summary = validator.finish()
        left = [k for kind in ("tensors", "images") for k in redis_client.scan_iter(f"omnirl:{job}:{kind}:*")]
        q.cleanup()
    assert (summary["n"], summary["missing"], summary["val_reward_mean"], summary["val_reward_ocr"]) == (1, 2, 0.5, 0.5)
    assert summary["val_component_missing_ocr"] == 0 and summary["val_background_darkness"] == 0.0
    assert summary["grid"] == str(tmp_path / "samples" / "step-00004.png") and Path(summary["grid"]).is_file()
    assert not left  # the round's tensors are deleted
    warned = [r.getMessage() for r in caplog.records if "missing" in r.getMessage()]
    assert len(warned) == 1, warned
    assert warned[0] == "validation at step 4: 2 of 3 samples missing, left out of the means (n=1): val4:1:3, " \
        "val4:2:3: omnirl:valgone:images:x expired before it was read", warned[0]


def test_a_validation_image_deleted_within_its_ttl_is_not_called_expired(tmp_path, redis_client, caplog):
    """A Redis restarted without persistence mid-run (found by hand: `omnirl run` of a shared Redis, the server
    killed and started again): the round's warning said "omnirl:…:images:val6:0:1 was gone …, 5 s after the sample
    was generated (spec.transferQueue.tensorTtlSeconds 3600); raise spec.transferQueue.tensorTtlSeconds", a fix
    that cannot help. An image gone within its TTL is called deleted; one gone past it, expired, with the fix."""
    spec = _val_spec(tmp_path)
    warned = []
    with TransferQueue(redis_client, "valdel") as q:
        validator = Validator(q, spec, lambda p: [1], tmp_path, nonce=0)
        for step, age_s in ((0, 5.0), (1, 4000.0)):
            validator.publish(at_step=step, version=step)
            for i in range(3):
                q.publish(q.streams.samples, {"sample_id": f"s{step}{i}"}, {"x0": torch.zeros(1)},
                          image=torch.full((8, 16, 3), 255, dtype=torch.uint8))
            msgs = q.consume(q.streams.samples, "v", "v", count=10, block_ms=0)
            for i, msg in enumerate(msgs):
                validator.record(ScoreMeta(sample_id=f"val{step}:{i}:0", kind="val", step=step,
                                           group_id=f"val{step}:{i}", policy_version=step, reward=0.5,
                                           rewards={"ocr": 0.5}, generated_at=time.time() - age_s, scored_at=0.0),
                                 msg.tensor_key)
            q.delete_tensors([msgs[0].tensor_key])
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="omnirl.controller"):
                summary = validator.finish()
            assert (summary["n"], summary["missing"]) == (2, 1)
            warned += [r.getMessage() for r in caplog.records if "missing" in r.getMessage()]
        q.cleanup()
    assert warned == [
        "validation at step 0: 1 of 3 samples missing, left out of the means (n=2): val0:0:0: "
        "omnirl:valdel:images:s00 was deleted before the controller read it for the round, 5 s after the sample was "
        "generated (within spec.transferQueue.tensorTtlSeconds 3600: not expired; a Redis restarted without "
        "persistence, or a key evicted or deleted)",
        "validation at step 1: 1 of 3 samples missing, left out of the means (n=2): val1:0:0: "
        "omnirl:valdel:images:s10 was gone when the controller read it for the round, 4000 s after the sample was "
        "generated (spec.transferQueue.tensorTtlSeconds 3600); raise spec.transferQueue.tensorTtlSeconds above the "
        "longest a validation round takes"], warned


def test_a_round_whose_every_sample_is_gone_has_no_mean_and_a_failed_scorer_still_fails_it(tmp_path, redis_client):
    """Every sample lost: n=0, mean None (not 0: no silently wrong mean), no grid. A sample a scorer failed
    (not lost) still raises SampleUnscored: only gone tensors are counted missing."""
    spec = _val_spec(tmp_path)
    with TransferQueue(redis_client, "valnone") as q:
        validator = Validator(q, spec, lambda p: [1], tmp_path, nonce=0)
        validator.publish(at_step=0, version=0)
        for i in range(3):
            validator.record(ScoreMeta(sample_id=f"val0:{i}:0", kind="val", step=0, group_id=f"val0:{i}",
                                       policy_version=0, failed=True, lost=True, reason="gone",
                                       generated_at=0.0, scored_at=0.0), None)
        summary = validator.finish()
        assert (summary["n"], summary["missing"], summary["val_reward_mean"], summary["grid"]) == (0, 3, None, None)
        validator.publish(at_step=1, version=1)
        for i in range(3):
            validator.record(ScoreMeta(sample_id=f"val1:{i}:0", kind="val", step=1, group_id=f"val1:{i}",
                                       policy_version=1, failed=True, reason="ocr: boom",
                                       generated_at=0.0, scored_at=0.0), None)
        with pytest.raises(SampleUnscored, match="could not be scored: ocr: boom"):
            validator.finish()
        q.cleanup()


# --------------------------------------------------------------------------------------- the step's book

def test_the_stored_book_comes_back_and_marks_only_current_members_failed():
    """`StepBook.to_json` → JSON → `from_json` is the same book; `fail_lost` marks the named members of the
    groups' current attempts failed (a regenerated group's old ids are skipped)."""
    book = StepBook(3, t_published=12.5, refills=1, dropped=["3:9"], failures=["group 3:9: x"])
    for p in (4, 7):
        req = GenerateRequest(kind="train", step=3, group_id=f"3:{p}", prompt="p", prompt_ids=[1, 2],
                              samples=[SampleSeed(sample_id=f"3:{p}:{i}", seed=i) for i in range(2)], num_steps=4)
        book.add(f"3:{p}", req)
        for i in range(2):
            book.record(ScoreMeta(sample_id=f"3:{p}:{i}", kind="train", step=3, group_id=f"3:{p}", policy_version=0,
                                  reward=0.25 * i, rewards={"ocr": 0.25 * i}, generated_at=1.0, scored_at=2.0),
                        f"omnirl:j:tensors:3:{p}:{i}")
    back = StepBook.from_json(json.loads(json.dumps(book.to_json())))
    assert back == book
    assert back.fail_lost(["3:7:1", "3:7:0r1", "2:1:0"], "gone") == ["3:7"]
    assert back.groups["3:7"].failed_reasons == ["3:7:1: gone"] and back.groups["3:7"].scores["3:7:1"].reward is None
    assert not back.groups["3:4"].failed_reasons


# --------------------------------------------------------------------------------------- the actor (processes)

# imported first by the role processes (sitecustomize on PYTHONPATH), as if tensorTtlSeconds had passed: the
# actor's first read of step 0's train request finds the tensors of the request's first sample gone, and the
# reward role's first delivery of the first validation round's sample 1 finds its tensors gone
EXPIRE_IN_ACTOR = '''
import sys
if "role" in sys.argv and ("actor" in sys.argv or "reward" in sys.argv):
    from omnirl.transfer import TransferQueue
    consume, hit = TransferQueue.consume, []
    def expiring_consume(self, stream, *args, **kwargs):
        msgs = consume(self, stream, *args, **kwargs)
        for m in msgs:
            if hit:
                break
            if stream == self.streams.control and m.meta.get("type") == "train" and m.meta["step"] == 0:
                sid, key = m.meta["items"][0]["sample_id"], m.meta["items"][0]["tensor_key"]
            elif stream == self.streams.samples and m.meta["sample_id"].startswith("val0:1:"):
                sid, key = m.meta["sample_id"], m.tensor_key
            else:
                continue
            hit.append(sid)
            self.delete_tensors([key])
            print(f"test hook: deleted the tensors of {sid}", file=sys.stderr, flush=True)
        return msgs
    TransferQueue.consume = expiring_consume
'''


@pytest.mark.slow  # 20-40 s on 2 busy cores: a whole run with two validation rounds
def test_omnirl_run_regenerates_the_group_whose_tensors_the_actor_found_gone(tmp_path):
    """`omnirl run` (real redis-server and role processes), 1 step of 2 groups of 3, 2 held-out prompts: one
    sample's tensors vanish before the actor reads the batch, one validation sample's before the reward role reads
    it. The run finishes (before: exit 1, MissingTensors; exit 3 for the validation sample); the actor warns once
    naming the TTL field and its fix, the controller regenerates that one group and hands the step again: step 0
    trains 6 samples in whole groups, `refills` 1; the ledger: 9 generated and scored, 6 trained, nothing lost or
    duplicated. The first validation round reports 1 sample and 1 missing, the last one 2 and none."""
    from omnirl.evaluation.ledger import check_ledger, group_of

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(EXPIRE_IN_ACTOR)
    job, out = _job(tmp_path, "actor-gone", validation={"everySteps": 1, "numSteps": 4, "maxPrompts": 2}), \
        tmp_path / "out"
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["data"]["validationPrompts"] = str(ROOT / "examples/prompts/ocr-heldout.txt")
    job.write_text(yaml.safe_dump(doc))
    done = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", str(job), "--no-ray", "--device", "cpu",
                           "--out", str(out)], capture_output=True, text=True, timeout=240, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), *PATHS])})
    console = done.stdout + done.stderr
    assert done.returncode == 0, console[-3000:]
    hooked = [line.rsplit(" ", 1)[1] for line in console.splitlines() if "test hook: deleted the tensors of" in line]
    assert len(hooked) == 2 and sum(s.startswith("val0:1:") for s in hooked) == 1, console[-3000:]
    lost_id = next(s for s in hooked if not s.startswith("val"))
    vals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    vals = [(v["step"], v["n"], v["missing"]) for v in vals if v["event"] == "validation"]
    assert vals == [(0, 1, 1), (1, 2, 0)]
    missed = [line for line in console.splitlines() if "samples missing, left out of the means" in line]
    assert len(missed) == 1 and "validation at step 0: 1 of 2 samples missing, left out of the means (n=1): " \
        "val0:1:0: omnirl:actor-gone:images:val0:1:0 was deleted before it was read" in missed[0], missed
    warned = [line for line in console.splitlines() if "actor WARNING" in line]
    assert len(warned) == 1 and "step 0 not trained: 1 of 6 tensor keys were gone when the actor read step 0's batch " \
        f"(e.g. omnirl:actor-gone:tensors:{lost_id}): expired after spec.transferQueue.tensorTtlSeconds (3600 s), " \
        "or deleted; the controller regenerates their groups" in warned[0], warned
    assert "Raise spec.transferQueue.tensorTtlSeconds above the longest a sample waits to be trained" in warned[0]
    regen = [line for line in console.splitlines() if "regenerating" in line]
    assert len(regen) == 1 and f"step 0: the actor found the tensors of 1 sample(s) gone, not trained: regenerating " \
        f"1 group(s) ({group_of(lost_id)})" in regen[0], regen
    assert refill_shapes(out) == {0: (6, 2, 1, 0)}
    counts = check_ledger(out, total_steps=1, group_size=3, prompts_per_step=2)
    assert counts.samples() == (9, 9, 6, 0, 0, 3), counts.problems
    trained = trained_sample_ids(out)
    assert lost_id not in trained and sum(group_of(s) == f"{group_of(lost_id)}r1" for s in trained) == 3


def _actor(tmp_path: Path, job: Path, redis_url: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(PATHS), "OMNIRL_JOB_NAME": yaml.safe_load(job.read_text())[
        "metadata"]["name"], "OMNIRL_REDIS_URL": redis_url, "OMNIRL_WORKER_ID": "actor-0", "OMNIRL_OUT": str(tmp_path),
        "OMNIRL_DEVICE": "cpu", "OMNIRL_THREADS": "1", "OMNIRL_RESUME": "auto",
        "OMNIRL_WEIGHT_SYNC_ADDR": f"127.0.0.1:{_free_port()}"}
    return subprocess.Popen([sys.executable, "-m", "omnirl.cli", "role", "actor", "--job", str(job)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _free_port() -> int:
    from omnirl.transfer.redis_server import free_port

    return free_port()


def _stored_batch(q: TransferQueue, step: int) -> TrainRequest:
    """A stored (`kv:trainreqs`) batch of 2 samples whose tensor keys do not exist."""
    items = [TrainItem(sample_id=f"{step}:0:{i}", group_id=f"{step}:0", prompt_ids=[1], advantage=0.0,
                       tensor_key=f"omnirl:{q.job}:tensors:{step}:0:{i}", noise_level=0.7, sde_type="cps")
             for i in range(2)]
    req = TrainRequest(step=step, policy_version=step, items=items, controller_state={"data_position": [0, 2]})
    q.redis.hset(f"omnirl:{q.job}:kv:trainreqs", str(step), json.dumps({"request": req.model_dump(), "stats": {}}))
    return req


@pytest.mark.parametrize("trained_before", [True, False], ids=["trained-by-predecessor", "handed-never-trained"])
def test_a_restarted_actor_meets_a_stored_batch_whose_tensors_are_gone(tmp_path, redis_url, redis_client,
                                                                       trained_before):
    """`omnirl role actor` starting with a stored batch of step 0 whose tensors are gone. Its predecessor trained
    it (`kv:actor_state` step 0) and no checkpoint covers it: the update cannot be rebuilt, exit 4 with one line
    naming tensorTtlSeconds (before: MissingTensors, exit 1, every restart). Never trained: `TrainLost` for the
    step naming both samples, and the actor goes on to wait for its rollout workers (before: exit 1)."""
    job = _job(tmp_path, f"replay-{int(trained_before)}")
    q = TransferQueue(redis_client, f"replay-{int(trained_before)}")
    _stored_batch(q, 0)
    if trained_before:
        q.set_json("actor_state", {"step": 0, "policy_version": 1, "data_position": [0, 2]})
    proc = _actor(tmp_path, job, redis_url)
    try:
        if trained_before:
            text = proc.communicate(timeout=60)[0]
            last = text.strip().splitlines()[-1]
            assert proc.returncode == CONFIG_ERROR_EXIT, text[-3000:]
            assert last.startswith("omnirl role actor: configuration error: spec.transferQueue.tensorTtlSeconds: the "
                                   "job's actor had trained step 0, but step 0's batch, which checkpoint "), last
            assert "cannot be replayed: 2 of 2 tensor keys were gone when the actor read step 0's batch" in last
            assert "raise tensorTtlSeconds above the time between two checkpoints" in last
        else:
            deadline, lost = time.monotonic() + 60, []
            while not lost:
                assert proc.poll() is None, proc.communicate()[0][-3000:]
                assert time.monotonic() < deadline, "no TrainLost within 60 s"
                lost = [m.meta for m in q.consume(q.streams.control, "t", "t", count=10, block_ms=200)
                        if m.meta.get("type") == "lost"]
            assert [(m["step"], m["samples"]) for m in lost] == [(0, ["0:0:0", "0:0:1"])]
            time.sleep(1.0)
            assert proc.poll() is None  # waiting for its rollout workers, not crashed
            q.set_json("stop", True)
            assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        q.cleanup()


# --------------------------------------------------------------------------------------- the controller (in-process)

def test_a_successor_controller_regenerates_only_the_groups_of_the_lost_samples(tmp_path, redis_url, redis_client):
    """Controller A collects step 0 (2 groups of 3) and hands it over (`kv:trainreqs` with its book), then dies.
    Controller B gets the actor's `TrainLost` naming one sample of group 0:p: it takes the book back from Redis,
    refills that group alone (attempt r1: new ids and seeds on the requests stream, its other tensors deleted) and
    keeps the other group's scores and tensors; the new batch holds group 0:p's r1 samples and the other group's
    originals, with `refills` 1. A `TrainLost` naming none of the handed batch (an earlier batch's) is ignored."""
    from omnirl.api.messages import TrainDone, TrainLost
    from omnirl.api.runtime import RoleEnv
    from omnirl.controller.loop import Controller

    name = "regen"
    job = job_from_dict(yaml.safe_load(_job(tmp_path, name).read_text()))
    env = RoleEnv(job_name=name, redis_url=redis_url, weight_sync_host="127.0.0.1", weight_sync_port=1,
                  worker_id="controller-0", out_dir=str(tmp_path))
    q = TransferQueue(redis_client, name)

    def score(c: Controller, sid: str, gid: str, reward: float) -> None:
        key = f"omnirl:{name}:tensors:{sid}"
        q.redis.set(key, b"x")
        c.books[0].record(ScoreMeta(sample_id=sid, kind="train", step=0, group_id=gid, policy_version=0, reward=reward,
                                    rewards={"ocr": reward}, generated_at=1.0, scored_at=2.0), key)

    a = Controller(job, env)
    a._publish_step(0)
    keys = list(a.books[0].groups)
    for k, key in enumerate(keys):
        for i in range(3):
            score(a, f"{key}:{i}", key, 0.1 * (i + 3 * k))
    book = a.books[0]
    items, stats = a._advantages(book)
    req = TrainRequest(step=0, policy_version=0, items=items, controller_state={"data_position": [0, 2]})
    q.redis.hset(f"omnirl:{name}:kv:trainreqs", "0", json.dumps({"request": req.model_dump(), "stats": stats,
                                                                 "book": book.to_json()}))
    a.close()

    b = Controller(job, env)
    b.start_step = 0
    lost_group, kept = keys
    b._regenerate(TrainLost(step=0, samples=[f"{lost_group}:1"], reason="gone"))
    before = q.stream_length(q.streams.requests)
    b._settle(b.books[0])
    assert q.stream_length(q.streams.requests) == before + 1
    refill = GenerateRequest.model_validate(q.consume(q.streams.requests, "t", "t", count=10, block_ms=0)[-1].meta)
    assert refill.group_id == f"{lost_group}r1" and [s.sample_id for s in refill.samples] == \
        [f"{lost_group}:{i}r1" for i in range(3)]
    assert not any(q.redis.exists(f"omnirl:{name}:tensors:{lost_group}:{i}") for i in range(3))
    assert all(q.redis.exists(f"omnirl:{name}:tensors:{kept}:{i}") for i in range(3))
    for i in range(3):
        score(b, f"{lost_group}:{i}r1", f"{lost_group}r1", 0.5)
    assert b.books[0].complete
    items2, stats2 = b._advantages(b.books[0])
    assert sorted(it.sample_id for it in items2) == sorted([f"{lost_group}:{i}r1" for i in range(3)] +
                                                           [f"{kept}:{i}" for i in range(3)])
    assert (stats2["samples"], stats2["groups"], stats2["refills"]) == (6, 2, 1)

    req2 = TrainRequest(step=0, policy_version=0, items=items2)
    q.ensure_group(q.streams.scores, "controller")
    q.ensure_group(q.streams.control, "controller")
    b.lost[0] = TrainLost(step=0, samples=[f"{lost_group}:1"], reason="gone")  # answered the first batch
    q.publish(q.streams.control, TrainDone(step=0, policy_version=1, metrics={}).model_dump())
    assert isinstance(b._wait_trained(0, req2), TrainDone)
    lost = b.lost[0] = TrainLost(step=0, samples=[f"{kept}:0"], reason="gone")  # answers this batch
    assert not b.trained  # the TrainDone above was taken
    assert b._wait_trained(0, req2) is lost
    b.close()
    q.cleanup()
