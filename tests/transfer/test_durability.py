"""Durability pieces against real parts: atomic checkpoints, OMNIRL_RESUME, taking over a dead
consumer's entries, heartbeats and the liveness probe, a SIGKILLed Redis coming back with its AOF
while a client retries, and a successor controller meeting a dead one's refill."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import grpc
import pytest
import redis
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tests.controller.test_controller_units import request, score
from tests.helpers import crash_everywhere

from omnirl.actor.checkpoint import COMPLETE, load_checkpoint, resolve_checkpoint, save_checkpoint
from omnirl.api.exits import CONFIG_ERROR_EXIT, FAILED
from omnirl.api.runtime import RoleEnv
from omnirl.controller.groups import StepBook, attempt_of, refill_request
from omnirl.launch.roles import should_resume
from omnirl.launch.supervise import clear_start_flags
from omnirl.models.policy_io import has_checkpoint, make_latest
from omnirl.telemetry.health import HealthServer
from omnirl.transfer import TransferQueue, start_redis_server
from omnirl.transfer.heartbeat import Heartbeat, last_beats, read_heartbeats, stale_roles, stalled_text
from omnirl.transfer.queue import redis_client


def _save(root, step):
    t = {"w": torch.full((2,), float(step))}
    return save_checkpoint(root, step, policy=t, trained=t, old=None, optimizer=({}, {"param_groups": [],
                           "scalars": {}}), state={"step": step}, keep=2)


def test_a_checkpoint_without_its_marker_is_not_resumed(tmp_path):
    root = tmp_path / "checkpoints"
    assert not has_checkpoint(root) and not should_resume("auto", root)
    final = _save(root, 3)
    assert has_checkpoint(root) and should_resume("auto", root) and (final / COMPLETE).read_text() == "3"
    (final / COMPLETE).unlink()  # as if the writer died before its last file
    assert not has_checkpoint(root) and not should_resume("auto", root)
    with pytest.raises(FileNotFoundError, match="incomplete checkpoint"):
        resolve_checkpoint(root)
    assert should_resume("1", root)  # explicit: the actor then fails loudly
    (root / ".tmp-step-000004-1").mkdir()  # a killed writer's leftovers are removed by the next save
    _save(root, 4)
    assert not list(root.glob(".tmp-*")) and has_checkpoint(root)


def test_a_damaged_checkpoint_file_is_named_in_the_error(tmp_path):
    """`--resume` on a checkpoint with a damaged file: the actor's one-line configuration error names
    the file (it said "checkpoint …/latest: scalars" for an optimizer.json without that entry)."""
    from omnirl.actor.checkpoint import load_checkpoint

    root = tmp_path / "checkpoints"
    final = _save(root, 3)
    assert load_checkpoint(root)["state"] == {"step": 3}
    (final / "optimizer.json").write_text('{"param_groups": []}')
    with pytest.raises(ValueError, match=r"^optimizer.json: no 'scalars' entry$"):
        load_checkpoint(root)
    (final / "optimizer.json").write_text('{"param_groups": [], "scalars": {}}')
    (final / "state.json").write_text("{garbage")
    with pytest.raises(ValueError, match=r"^state.json: Expecting property name"):
        load_checkpoint(root)
    (final / "state.json").write_text('{"step": 3}')
    (final / "trained.safetensors").write_bytes((final / "trained.safetensors").read_bytes()[:20])
    with pytest.raises(ValueError, match=r"^trained.safetensors: Error while deserializing header"):
        load_checkpoint(root)


def test_checkpoints_and_exports_share_one_latest_link_and_pruning(tmp_path):
    """`make_latest` (checkpoints and exports): `latest` → the newest write, the `keep` newest
    `step-*` kept besides it, a re-written older step (a resumed run) never pruned, keep 0 prunes nothing."""
    root = tmp_path / "exports"
    for step in range(4):
        (root / f"step-{step:06d}").mkdir(parents=True)
    make_latest(root, root / "step-000003", keep=2)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000002", "step-000003"]
    assert (root / "latest").resolve() == root / "step-000003" and os.readlink(root / "latest") == "step-000003"
    (root / "step-000001").mkdir()  # a resumed run writes step 1 again
    make_latest(root, root / "step-000001", keep=1)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000001", "step-000003"]
    assert (root / "latest").resolve() == root / "step-000001"
    make_latest(root, root / "step-000003", keep=0)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000001", "step-000003"]
    assert (root / "latest").resolve() == root / "step-000003" and not list(root.glob(".latest-*"))


def _copy(root, step, value: float, keep: int = 2):
    """A checkpoint of `step` whose tensors all hold `value` (tells two copies of one step apart)."""
    t = {"w": torch.full((2,), value)}
    return save_checkpoint(root, step, policy=t, trained=t, old=None, optimizer=({}, {"param_groups": [],
                           "scalars": {}}), state={"step": step}, keep=keep)


def _latest(root) -> tuple[int, float]:
    ck = load_checkpoint(root)  # what a resume loads: `latest`
    return ck["state"]["step"], float(ck["policy"]["w"][0])


@pytest.mark.parametrize("before, loadable, left", [
    ("step 1", {(1, 1.0), (2, 3.0)}, ["latest", "step-000001", "step-000002"]),
    # `latest` names step 2 (e.g. a restarted controller exporting its last step again): it was deleted first
    ("step 2 named by latest", {(2, 2.0), (2, 3.0)}, ["latest", "step-000001", "step-000002.1"]),
    # step 2 renamed into place by a save killed before its `latest`: the replay saves step 2 again
    ("step 2 not named by latest", {(1, 1.0), (2, 3.0)}, ["latest", "step-000001", "step-000002"]),
])
def test_a_save_killed_at_any_point_leaves_latest_loadable(tmp_path, monkeypatch, before, loadable, left):
    """A save of step 2 (tensors 3.0) killed before each of its directory changes in turn: `latest`
    loads a complete checkpoint every time, the old copy or the new one, and the save done again
    (the actor's replay) publishes the new one. Before, the same step saved again while `latest`
    named it was deleted before the new copy was renamed into place: a kill in between left
    `latest` naming a half-deleted directory (FileNotFoundError: …/step-000002/trained.safetensors)."""
    def prepare(n):
        root = tmp_path / str(n) / "checkpoints"
        _copy(root, 1, 1.0)
        if before != "step 1":
            _copy(root, 2, 2.0)
        if before == "step 2 not named by latest":
            make_latest(root, root / "step-000001", keep=0)
        return root

    def check(root, finished):
        assert _latest(root) in loadable
        if _latest(root) != (2, 3.0):
            _copy(root, 2, 3.0)  # done again after the kill (the actor's replay, the controller's export)
        assert _latest(root) == (2, 3.0)
        names = sorted(p.name for p in root.iterdir())
        # a kill after `latest` names the new copy may leave the old one (pruned later) and `.tmp-*` (the next save's)
        assert all(n.startswith(".tmp-step-000002") for n in names if n.startswith(".")), names
        if finished:
            assert names == left

    points = crash_everywhere(monkeypatch, prepare, lambda root: _copy(root, 2, 3.0), check)
    assert points >= 3  # rename into place, the `latest` link's two, at least


def test_a_save_is_on_disk_before_latest_names_it_and_before_an_older_one_is_pruned(tmp_path, monkeypatch):
    """The order of a save's fsyncs and directory changes (a power cut keeps only what was fsynced):
    every file and directory of the new checkpoint before its rename into place, the checkpoints
    directory after that rename and again after `latest` is switched, before the pruned step goes.
    Before, the directory entries (the rename, the link) were never fsynced and the checkpoint's
    own directory neither."""
    root = (tmp_path / "checkpoints").resolve()
    _copy(root, 1, 1.0)
    _copy(root, 2, 2.0)
    seen = []
    fsync, rename, replace, rmdir = os.fsync, os.rename, os.replace, os.rmdir

    def record(kind, fn, *paths):
        seen.append((kind, *(str(p) for p in paths)))
        return fn(*paths)

    monkeypatch.setattr(os, "fsync", lambda fd: seen.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))) or fsync(fd))
    monkeypatch.setattr(os, "rename", lambda a, b: record("rename", rename, a, b))
    monkeypatch.setattr(os, "replace", lambda a, b: record("replace", replace, a, b))
    monkeypatch.setattr(os, "rmdir", lambda p, **kw: seen.append(("rmdir", str(p))) or rmdir(p, **kw))
    final = _copy(root, 3, 3.0, keep=2)
    monkeypatch.undo()

    assert final == root / "step-000003"
    publish = next(i for i, e in enumerate(seen) if e[0] == "rename" and e[2] == str(final))
    tmp = seen[publish][1]
    synced_before = {e[1] for e in seen[:publish] if e[0] == "fsync"}
    written = {os.path.join(tmp, p.name) for p in final.iterdir()}
    assert written | {tmp} <= synced_before, sorted(written | {tmp} - synced_before)
    switch = next(i for i, e in enumerate(seen) if e[0] == "replace" and e[2] == str(root / "latest"))
    assert ("fsync", str(root)) in seen[publish:switch]
    pruned = seen.index(("rmdir", str(root / "step-000001")))
    assert switch < pruned and ("fsync", str(root)) in seen[switch:pruned]
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000002", "step-000003"]


def test_resume_mode_accepts_0_1_auto_only():
    base = {"OMNIRL_JOB_NAME": "j", "OMNIRL_REDIS_URL": "redis://r:6379/0"}
    modes = [RoleEnv.from_environ({**base, **({"OMNIRL_RESUME": v} if v is not None else {})}).resume
             for v in (None, "0", "1", "AUTO")]
    assert modes == ["0", "0", "1", "auto"]
    with pytest.raises(ValueError, match=r"OMNIRL_RESUME='yes': expected 0, 1 or auto"):
        RoleEnv.from_environ({**base, "OMNIRL_RESUME": "yes"})


def test_roles_started_again_find_no_stop_flag_and_no_stale_actor_ready(redis_client):
    """`--resume` and `restart-job` clear `stop` and `actor_ready` of this job only; its state stays."""
    queue, other = TransferQueue(redis_client, "j"), TransferQueue(redis_client, "k")
    for q in (queue, other):
        for name, value in (("stop", True), ("actor_ready", {"policy_version": 3}), ("actor_state", {"step": 2})):
            q.set_json(name, value)
    clear_start_flags(queue)
    assert [queue.get_json(n) for n in ("stop", "actor_ready", "actor_state")] == [None, None, {"step": 2}]
    assert [other.get_json(n) for n in ("stop", "actor_ready")] == [True, {"policy_version": 3}]


def test_an_actor_whose_checkpoint_was_lost_stops_once_with_the_path_and_the_fix(tmp_path, redis_url):
    """`omnirl role actor` (what `omnirl run --resume` and `restart-job` start) after the checkpoint
    `latest` named was deleted, while the job's records say step 1 was trained: it raised a RuntimeError
    from its replay (exit 1), and the launcher restarted the job until maxRestarts. Now exit 4 at
    start-up with one line naming the link, what it names, the older step-000000 that cannot stand in
    (the batches after it are gone) and the fix."""
    import subprocess
    import sys

    job = f"lost-{os.getpid()}"
    root = tmp_path / "checkpoints"
    _save(root, 0)
    (root / "latest").unlink()
    (root / "latest").symlink_to("step-000001")  # the newest checkpoint, deleted
    queue = TransferQueue(redis.Redis.from_url(redis_url), job)
    try:
        queue.set_json("actor_state", {"step": 1, "policy_version": 2, "data_position": [0, 0]})
        env = {**os.environ, "OMNIRL_JOB_NAME": job, "OMNIRL_REDIS_URL": redis_url, "OMNIRL_OUT": str(tmp_path),
               "OMNIRL_RESUME": "auto"}
        proc = subprocess.run([sys.executable, "-m", "omnirl.cli", "role", "actor", "--job", "examples/ocr-nft.yaml"],
                              capture_output=True, text=True, timeout=300, env=env)
    finally:
        queue.cleanup()
        queue.close()
    assert proc.returncode == CONFIG_ERROR_EXIT, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        f"omnirl role actor: configuration error: checkpoint {root / 'latest'}: the job's actor had trained step 1, "
        "but it names step-000001, which is gone, and no stored batch follows it (the older step-000000 cannot "
        "stand in: the batches after it were deleted): the checkpoint directory was lost or belongs to another run; "
        "restore it (on Kubernetes: spec.storage, a persistent volume), or start a fresh run in another --out "
        "(restarting cannot help)"), proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("leftover", ["nothing", "dangling latest"])
def test_an_explicit_resume_without_a_checkpoint_is_one_configuration_error(tmp_path, redis_url, leftover):
    """`OMNIRL_RESUME=1` (set by hand or in a pod template; the launchers pass `auto`) with no checkpoint
    under OMNIRL_OUT: a FileNotFoundError traceback after the model loaded, exit 1 (restarted per
    failurePolicy). Now exit 4 with one line naming the path and the fix."""
    import subprocess
    import sys

    latest = tmp_path / "checkpoints" / "latest"
    if leftover == "dangling latest":
        latest.parent.mkdir()
        latest.symlink_to("step-000020")
    env = {**os.environ, "OMNIRL_JOB_NAME": f"again-{os.getpid()}", "OMNIRL_REDIS_URL": redis_url,
           "OMNIRL_OUT": str(tmp_path), "OMNIRL_RESUME": "1"}
    proc = subprocess.run([sys.executable, "-m", "omnirl.cli", "role", "actor", "--job", "examples/ocr-nft.yaml"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == CONFIG_ERROR_EXIT, proc.stderr
    gone = " (it names step-000020, which is gone)" if leftover == "dangling latest" else ""
    assert proc.stderr.splitlines()[-1] == (
        f"omnirl role actor: configuration error: OMNIRL_RESUME=1 but there is no checkpoint to resume from: {latest} "
        f"does not exist{gone}; set OMNIRL_RESUME=auto (resume when a checkpoint exists, else start fresh) or 0 (start "
        "fresh), or point OMNIRL_OUT (omnirl role --out) at the run directory that holds spec.checkpoint.dir")
    assert "Traceback" not in proc.stderr, proc.stderr


def test_an_actor_starts_when_the_stored_batches_reach_the_trained_step_and_names_the_gap_otherwise(
        tmp_path, redis_client):
    """The actor's start-up check: checkpoint step 3 plus stored batches 4 and 5 rebuild step 5 (it
    starts); with step 7 trained, batch 6 is missing (exit 4: ConfigError naming step 5)."""
    import types

    from omnirl.actor.service import ActorService
    from omnirl.api.errors import ConfigError
    from omnirl.transfer import kv_key
    from omnirl.transfer.records import HANDED, ActorState

    root = tmp_path / "checkpoints"
    for step in (2, 3):
        _save(root, step)
    queue = TransferQueue(redis_client, f"reach-{os.getpid()}")
    me = types.SimpleNamespace(queue=queue, records=queue.records, trained_step=3, ckpt_root=root)
    try:
        for step in (4, 5):
            redis_client.hset(kv_key(queue.job, HANDED), str(step), "{}")
        queue.records.set_actor_state(ActorState(5, 6, [0, 0]))
        ActorService._check_reach(me)  # replayable: no error
        queue.records.set_actor_state(ActorState(7, 8, [0, 0]))
        with pytest.raises(ConfigError) as err:
            ActorService._check_reach(me)
        assert str(err.value).startswith(
            f"checkpoint {root / 'latest'}: the job's actor had trained step 7, but it holds step 3, and the stored "
            "batches after it reach step 5 only (the older step-000002 cannot stand in: the batches after it were "
            "deleted): the checkpoint directory was lost"), err.value
    finally:
        queue.cleanup()


@pytest.mark.parametrize(("checkpointed", "said"), [(-1, "(no checkpoint yet)"), (3, "(after checkpoint step 3)")])
def test_a_replay_line_says_no_checkpoint_yet_not_checkpoint_step_minus_1(tmp_path, redis_client, caplog,
                                                                          checkpointed, said):
    """An actor restarted before the run's first checkpoint logged "replaying step 0 from its stored request
    (after checkpoint step -1)" (seen on `omnirl run` with the actor SIGKILLed after step 0's result)."""
    import logging
    import types

    from omnirl.actor.service import ActorService
    from omnirl.api.messages import TrainRequest
    from omnirl.transfer import kv_key
    from omnirl.transfer.records import HANDED

    queue = TransferQueue(redis_client, f"replay-line-{os.getpid()}-{checkpointed + 1}")
    trained = []

    def train(req, replay):  # the update itself is not this test's subject
        trained.append((req.step, replay))
        me.trained_step = req.step

    me = types.SimpleNamespace(queue=queue, records=queue.records, trained_step=checkpointed,
                               checkpointed_step=checkpointed, ckpt_root=tmp_path, _train=train,
                               ranks=types.SimpleNamespace(max=lambda value: value))
    step = checkpointed + 1
    try:
        redis_client.hset(kv_key(queue.job, HANDED), str(step), json.dumps(
            {"request": TrainRequest(step=step, policy_version=step, items=[]).model_dump()}))
        with caplog.at_level(logging.INFO, logger="omnirl.actor"):
            ActorService._replay(me)
    finally:
        queue.cleanup()
    assert trained == [(step, True)]
    assert [r.getMessage() for r in caplog.records if r.name == "omnirl.actor"] == [
        f"replaying step {step} from its stored request {said}"]


def test_take_over_and_recover_return_a_dead_consumers_entries(redis_client):
    q = TransferQueue(redis_client, "dur", claim_idle_s=3600)
    s = q.streams.scores
    q.ensure_group(s, "g")
    ids = [q.publish(s, {"i": i}) for i in range(3)]
    assert [m.id for m in q.consume(s, "g", "dead", count=3, block_ms=0)] == ids
    assert [m.meta["i"] for m in q.recover(s, "g", "dead")] == [0, 1, 2]  # a restart with the same name
    assert q.consume(s, "g", "other", count=3, block_ms=0) == []  # not idle long enough to reclaim
    taken = q.take_over(s, "g", "successor")
    assert [m.id for m in taken] == ids and q.pending_count(s, "g") == 3
    q.ack(s, "g", ids)
    assert q.take_over(s, "g", "successor") == []
    q.cleanup()  # the session's Redis is shared: leave no keys of this job


def test_heartbeats_name_the_stale_role_and_veto_the_health_probe(redis_client):
    hb = Heartbeat(redis_client, "dur", "reward", "reward-0", every_s=0.0)
    hb.beat(progressed=True)
    beats = read_heartbeats(redis_client, "dur")
    assert beats["reward-0"]["progress"] == 1 and beats["reward-0"]["pid"] == os.getpid()
    t = beats["reward-0"]["t"]
    assert stale_roles(beats, 10.0, now=t + 5) == {}
    assert stale_roles(beats, 10.0, now=t + 11) == pytest.approx({"reward-0": 11.0})
    server = HealthServer(0)
    live = {"ok": True}
    server.set_liveness(lambda: live["ok"])
    server.set_serving(True)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            assert stub.Check(health_pb2.HealthCheckRequest(service="")).status == health_pb2.HealthCheckResponse.SERVING
            live["ok"] = False  # the main loop stopped beating
            assert stub.Check(health_pb2.HealthCheckRequest(service="")).status == \
                health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        server.stop()
        TransferQueue(redis_client, "dur").cleanup()


def test_a_rollout_waiting_for_the_actor_names_the_actors_last_beat(redis_client):
    """The rollout's line while the actor's store does not answer says whether the actor is alive
    (`last_beats`): its last beat and whether a start-up wrote it, or that Redis holds none."""
    assert last_beats(read_heartbeats(redis_client, "seen"), "actor") == \
        "no actor heartbeat in Redis (not started yet, or gone)"
    Heartbeat(redis_client, "seen", "actor", "actor-0", every_s=0.0).beat(startup=True)
    Heartbeat(redis_client, "seen", "reward", "reward-0", every_s=0.0).beat()
    beats = read_heartbeats(redis_client, "seen")
    assert last_beats(beats, "actor", now=beats["actor-0"]["t"] + 12.2) == "actor-0 last beat 12 s ago while starting"
    TransferQueue(redis_client, "seen").cleanup()


def test_the_stalled_status_names_the_startup_deadline_after_a_startup_beat(redis_client):
    """`status.stalled` said `rollout-0: no heartbeat for 11 s` for a role whose start-up or torch.compile
    outlasted startupDeadlineSeconds (its covering thread's beats stopped), pointing at
    progressDeadlineSeconds; now it names the start-up's bound. A main loop's stale beat is unchanged."""
    Heartbeat(redis_client, "stall", "rollout", "rollout-0", every_s=0.0).beat(startup=True)
    Heartbeat(redis_client, "stall", "reward", "reward-0", every_s=0.0).beat()
    Heartbeat(redis_client, "stall", "controller", "controller-0", every_s=0.0).beat()
    try:
        beats = read_heartbeats(redis_client, "stall")
        assert beats["rollout-0"]["startup"] is True and "startup" not in beats["reward-0"]
        t = max(b["t"] for b in beats.values())
        assert stalled_text(beats, 10.0, 3.0, skip="controller-0", now=t + 5) == ""
        assert stalled_text(beats, 10.0, 3.0, skip="controller-0", now=t + 11) == (
            "reward-0: no heartbeat for 11 s; rollout-0: no heartbeat for 11 s after its start-up or a torch.compile "
            "ran past failurePolicy.startupDeadlineSeconds=3 (raise it if loading or compiling takes longer)")
    finally:
        TransferQueue(redis_client, "stall").cleanup()


def test_a_sigkilled_redis_comes_back_with_its_aof_and_a_client_rides_it_out(tmp_path):
    """Restarted from a thread, as the launcher's watchdog does (with a `preexec_fn` the start hung in
    the forked child after the suite's gloo tests: see `omnirl.system.child`)."""
    server = start_redis_server(dir=str(tmp_path), aof=True)
    port = server.port
    client = redis_client(server.url, reconnect_s=60)
    q = TransferQueue(client, "aof")
    q.ensure_group(q.streams.samples, "reward")
    q.publish(q.streams.samples, {"sample_id": "0:0:0"}, {"x": torch.arange(3)}, done_kind="rollout")
    os.kill(server.pid, signal.SIGKILL)
    server.process.wait()
    restarted = []

    def restart_later():
        time.sleep(1.0)
        try:
            restarted.append(start_redis_server(port=port, dir=str(tmp_path), aof=True, die_with_parent=False))
        except Exception as err:  # noqa: BLE001 - shown by the assertion below instead of a silent thread death
            restarted.append(err)

    thread = threading.Thread(target=restart_later)
    thread.start()
    try:
        msgs = q.consume(q.streams.samples, "reward", "w", count=4, block_ms=0)  # retried until it is back
        thread.join(60)
        assert len(restarted) == 1 and not isinstance(restarted[0], Exception), restarted
        assert [m.meta["sample_id"] for m in msgs] == ["0:0:0"]
        assert q.load_tensors(msgs[0])["x"].tolist() == [0, 1, 2] and q.is_done("rollout", "0:0:0")
    finally:
        thread.join(60)
        client.close()
        for s in [server, *restarted]:
            if not isinstance(s, Exception):
                s.stop()
    with pytest.raises(redis.ConnectionError):  # no server: the retries give up and the error is raised
        redis_client(f"redis://127.0.0.1:{port}/0", reconnect_s=0).ping()


def test_a_redis_that_stays_down_is_given_up_after_about_reconnect_s_not_twice_that():
    """Each retry waits min(2 s, U·50 ms·2^n), ~2 s once n > 5: `int(reconnect_s) + 6` retries, taken for ~1 s
    each, gave up after ~2 × reconnect_s (21.5 s for 10 s; the roles' 120 s were ~250 s, past the launcher's
    verdict at 150 s that counts on them having given up)."""
    with socket.socket() as s:  # a port nothing listens on: each try is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        redis_client(f"redis://127.0.0.1:{port}/0", reconnect_s=6).ping()
    assert 2.5 < time.monotonic() - t0 < 10.5  # ~6.5 s; before: ~14 s


def test_a_call_blocked_when_redis_goes_gives_up_after_about_reconnect_s_not_its_square():
    """A blocking XREADGROUP (the actor's, the controller's wait) when Redis goes: its command's retries each
    retried the reconnect too (redis-py shares the retry), so counted alone they multiplied (the actor and the
    controller still retried when `omnirl run` stopped the job 150 s after Redis died; 21.5 s for reconnect_s 2).
    Now a deadline per call: the reconnect spends reconnect_s, and the command gives up with it."""
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL)
    client = redis_client(f"redis://127.0.0.1:{port}/0", reconnect_s=6)
    try:
        deadline = time.monotonic() + 10
        while True:  # it answers once it listens
            try:
                client.xgroup_create("s", "g", id="0", mkstream=True)
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline
        gone = []

        def stop():
            time.sleep(0.5)  # the read below is blocked by then
            gone.append(time.monotonic())
            server.terminate()
            server.wait()

        stopper = threading.Thread(target=stop)
        stopper.start()
        with pytest.raises(redis.ConnectionError):
            client.xreadgroup("g", "w", {"s": ">"}, count=1, block=60_000)
        stopper.join()
        assert 5.5 < time.monotonic() - gone[0] < 9.5  # ~6-8 s; before: ~12 s counted and timed, ~40 s counted
    finally:
        client.close()
        if server.poll() is None:
            server.terminate()
            server.wait()


_ROLE_LOSES_REDIS = """
import argparse, sys
import omnirl.launch.roles as roles
from omnirl.transfer.queue import redis_client
def run_role(role, job, env):
    try:
        redis_client(env.redis_url, reconnect_s=0).ping()  # the retries spent: redis-py's own error
    except Exception as err:
        if sys.argv[1] == "wrapped":  # as a role's code may re-raise it
            raise RuntimeError("reading the next batch") from err
        raise
roles.run_role = run_role
sys.exit(roles.main(argparse.Namespace(role="reward", job="job.yaml", out=None)))
"""


@pytest.mark.parametrize("how", ["raised", "wrapped"])
def test_a_role_that_loses_redis_says_so_in_one_line_and_exits_1(tmp_path, how):
    """A role whose Redis calls spent their retries died with redis-py's traceback (its retry loop, its socket
    code: ~40 lines per role) under `omnirl run`'s own Redis line; now one line naming the role, the Redis and
    who decides, exit 1 still (a crash to the supervisor, never a clean exit)."""
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMNIRL_JOB_NAME": "j", "OMNIRL_REDIS_URL": f"redis://:secret@127.0.0.1:{port}/0",
           "PYTHONPATH": os.pathsep.join(str(repo / p) for p in ("services", "operator", "."))}
    done = subprocess.run([sys.executable, "-c", _ROLE_LOSES_REDIS, how], capture_output=True, text=True, timeout=60,
                          cwd=repo, env=env)
    assert done.returncode == FAILED, done.stderr
    assert done.stderr.splitlines() == [
        f"omnirl role reward: Redis at 127.0.0.1:{port}/0 did not answer through its calls' retries (about 120 s; "
        f"ConnectionError: Error 111 connecting to 127.0.0.1:{port}. Connection refused.); this role gives up "
        "(exit 1) and the supervisor (omnirl run, or the operator) decides whether the job goes on"], done.stderr


def test_a_successor_meets_a_dead_controllers_refill():
    """The predecessor refilled group 4:7 (attempt 1); its successor, which only knows attempt 0,
    files an attempt-1 score: the group moves to attempt 1 with the same request, and attempt-0
    scores are then leftovers whose tensors are deleted."""
    book = StepBook(4)
    book.add("4:7", request())
    book.record(score("4:7:0", "4:7"), "old0")
    assert attempt_of("4:7") == 0 and attempt_of("4:7r2") == 2

    def refill(b, key, attempt):
        return refill_request(b.groups[key].request, attempt, [100 * attempt + i for i in range(3)])

    group = book.record(score("4:7:1r1", "4:7r1"), "new1", refill)
    assert group is not None and group.attempt == 1 and group.request.group_id == "4:7r1"
    assert [s.seed for s in group.request.samples] == [100, 101, 102]
    assert book.leftover_keys == ["old0"] and book.refills == 1
    assert book.record(score("4:7:2", "4:7"), "old2", refill) is None  # attempt 0: a leftover
    for i in (0, 2):
        book.record(score(f"4:7:{i}r1", "4:7r1"), f"new{i}", refill)
    assert book.complete and sorted(group.tensor_keys.values()) == ["new0", "new1", "new2"]
    assert json.loads(json.dumps(group.request.model_dump()))["group_id"] == "4:7r1"


def test_pruning_and_resume_order_checkpoints_by_step_number_past_the_zero_padding(tmp_path):
    """Step directories are `step-{step:06d}`: past step 999999 the name has seven digits. Sorted as
    text, `step-1000000` came before `step-999998`, so each save past it pruned the new checkpoints
    and kept the two of steps 999998-999999 for ever (the same for `step-N.10` before `step-N.2`).
    By number, the `keep` newest stay and a resume loads the numerically latest complete one."""
    root = tmp_path / "checkpoints"
    for step in (999_998, 999_999, 1_000_000, 1_000_001, 1_000_002):
        _copy(root, step, float(step), keep=2)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-1000001", "step-1000002"]
    assert _latest(root) == (1_000_002, 1_000_002.0)  # what a resume loads
    assert has_checkpoint(root)
    for k in (2, 10):  # copies of one step written again (`publish`): .10 is newer than .2
        (root / f"step-000005.{k}").mkdir()
    make_latest(root, root / "step-000005.10", keep=1)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000005.10", "step-1000002"]
    (root / "step-old").mkdir()  # not a step directory of ours: never pruned
    make_latest(root, root / "step-1000002", keep=1)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-1000002", "step-old"]
