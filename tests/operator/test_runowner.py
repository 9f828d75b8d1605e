"""One job name, one shared Redis, two runs: an RLJob and an `omnirl run` (or two RLJobs) must not share the
job's keys (``omnirl:{job}:*``). The operator's reconcile against kmock's emulator and a real redis-server;
the launcher's side through the real CLI.

Found by hand: `omnirl run` of a tiny OCR job with spec.transferQueue.redisUrl on a redis-server of its own,
its four roles beating; a reconcile of an RLJob of that name naming the same URL created its 11 children
(Pending, no event), so its pods would have read and written the local run's streams. And an RLJob whose pods
had not beaten yet left nothing in Redis, so an `omnirl run` of that name started and deleted its keys.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from omnirl.api.loader import job_from_dict
from omnirl.launch.preflight import claim_run, mark_stopped
from omnirl.transfer.heartbeat import Heartbeat
from omnirl.transfer.keys import kv_key
from omnirl.transfer.owner import OWNER_TTL_S, RUN_OWNER, read_owner
from omnirl_operator.reconcile import reconcile
from omnirl_operator.settings import OperatorSettings
from omnirl_operator.testing import EmulatedCluster, rljob_body

LOG = logging.getLogger("test")
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
REPO = Path(__file__).resolve().parents[2]


def manifest(redis_url: str, ns: str = "team-a") -> dict:
    return {"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "shared", "namespace": ns},
            "spec": {"data": {"trainPrompts": "/data/train.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}],
                     "transferQueue": {"redisUrl": redis_url}}}


def children(cluster: EmulatedCluster) -> list[str]:
    return sorted(f"{res.plural}/{name}" for (res, _, name), obj in cluster.emulator.objects.items()
                  if not obj.deleted and res.plural not in ("events", "rljobs"))


def beat(redis_client, *workers: str) -> None:
    for worker in workers:
        Heartbeat(redis_client, "shared", worker.split("-")[0], worker).beat()


def test_an_rljob_waits_while_an_omnirl_run_of_its_name_runs_on_its_redis_and_starts_once_it_ended(
        redis_client, redis_url, tmp_path):
    local = job_from_dict(manifest(redis_url))
    claim_run(redis_url, local, tmp_path / "out").close()  # what the launcher claims as its run starts
    beat(redis_client, "actor-0", "rollout-0")
    redis_client.set(kv_key("shared", "actor_state"), b'{"step": 3}')  # the local run's progress

    async def main() -> None:
        async with EmulatedCluster() as cluster:
            body = await cluster.create(rljob_body(manifest(redis_url)))
            first = await reconcile(body, cluster.api, OperatorSettings(), NOW, LOG)
            status = first.status
            assert children(cluster) == [] and first.actions == []  # nothing created
            assert status["phase"] == "Pending"
            ready = next(c for c in status["conditions"] if c["type"] == "Ready")
            assert (ready["status"], ready["reason"]) == ("False", "RedisNameInUse")
            assert status["message"].startswith(
                f"metadata.name: job 'shared' is in use on the Redis 127.0.0.1:{redis_url.rsplit(':', 1)[1].split('/')[0]} "
                f"(spec.transferQueue.redisUrl): an omnirl run on host {socket.gethostname()} (--out "
                f"{tmp_path / 'out'}, pid {os.getpid()}) is running this job on that Redis (heartbeats of actor-0, "
                "rollout-0 within 30 s)"), status["message"]
            assert "apply this RLJob under another metadata.name" in status["message"]
            assert first.events == [("Warning", "RedisNameInUse", status["message"])]
            assert read_owner(redis_client, "shared")["kind"] == "omnirl run"  # its record left as it was
            # the next resync: same status, no second event
            again = await reconcile({**body, "status": status}, cluster.api, OperatorSettings(), NOW, LOG)
            assert (again.status["message"], again.events, children(cluster)) == (status["message"], [], [])

            assert mark_stopped(redis_url, local, tmp_path / "out", finished=True) == ""  # the local run finished
            started = await reconcile({**body, "status": status}, cluster.api, OperatorSettings(), NOW, LOG)
            assert len(started.actions) == 11 and len(children(cluster)) == 11, started.actions
            assert started.status["message"] == "waiting for pods of: actor, controller, reward, rollout"
            owner = read_owner(redis_client, "shared")
            assert (owner["kind"], owner["namespace"], owner["uid"]) == ("RLJob", "team-a", body["metadata"]["uid"])
            assert 0 < redis_client.ttl(kv_key("shared", RUN_OWNER)) <= OWNER_TTL_S

    asyncio.run(main())


def test_its_own_pods_heartbeats_do_not_block_a_running_rljob_but_block_one_of_its_name_elsewhere(
        redis_client, redis_url):
    async def main() -> None:
        async with EmulatedCluster() as cluster:
            body = await cluster.create(rljob_body(manifest(redis_url)))
            first = await reconcile(body, cluster.api, OperatorSettings(), NOW, LOG)
            assert len(first.actions) == 11
            beat(redis_client, "actor-0", "rollout-0", "reward-0", "controller-0")  # its pods run
            # a resync, or a restarted operator's first reconcile: its own record, renewed
            redis_client.expire(kv_key("shared", RUN_OWNER), 5)
            again = await reconcile({**body, "status": first.status}, cluster.api, OperatorSettings(), NOW, LOG)
            assert again.events == [] and all(a.startswith("patched") for a in again.actions), again.actions
            assert redis_client.ttl(kv_key("shared", RUN_OWNER)) > 5
            # the operator was down longer than the record's TTL: the beats are its own pods' (it has children)
            redis_client.delete(kv_key("shared", RUN_OWNER))
            third = await reconcile({**body, "status": again.status}, cluster.api, OperatorSettings(), NOW, LOG)
            assert third.events == [] and read_owner(redis_client, "shared")["uid"] == body["metadata"]["uid"]

            # an RLJob of that name in another namespace (or cluster) on the same Redis
            other = await cluster.create(rljob_body(manifest(redis_url, ns="team-b")))
            refused = await reconcile(other, cluster.api, OperatorSettings(), NOW, LOG)
            assert refused.actions == [] and [k for k, obj in cluster.emulator.objects.items() if k[1] == "team-b"
                                              and k[0].plural not in ("rljobs", "events") and not obj.deleted] == []
            assert (f"RLJob team-a/shared (uid {body['metadata']['uid']}) holds this name on that Redis"
                    in refused.status["message"]), refused.status["message"]
            assert read_owner(redis_client, "shared")["uid"] == body["metadata"]["uid"]

    asyncio.run(main())


def test_a_stopped_omnirl_runs_pending_work_blocks_an_rljob_of_its_name(redis_client, redis_url, tmp_path):
    local = job_from_dict(manifest(redis_url))
    claim_run(redis_url, local, tmp_path / "out").close()
    beat(redis_client, "actor-0")
    assert mark_stopped(redis_url, local, tmp_path / "out", finished=False) == ""  # Ctrl-C: stop + stopped_run

    async def main() -> None:
        async with EmulatedCluster() as cluster:
            body = await cluster.create(rljob_body(manifest(redis_url)))
            out = await reconcile(body, cluster.api, OperatorSettings(), NOW, LOG)
            assert children(cluster) == []
            assert (f"an omnirl run stopped before it finished on host {socket.gethostname()} (--out "
                    f"{tmp_path / 'out'}) left its pending work") in out.status["message"], out.status["message"]
            assert f"omnirl run JOB --out {tmp_path / 'out'} --resume" in out.status["message"]

    asyncio.run(main())


def test_omnirl_run_is_refused_while_an_rljob_of_its_name_holds_the_redis_before_its_pods_beat(
        redis_client, redis_url, tmp_path):
    doc = yaml.safe_load((REPO / "examples/ocr-awm.yaml").read_text())
    for field in ("trainPrompts", "validationPrompts"):
        doc["spec"]["data"][field] = str(REPO / "examples" / doc["spec"]["data"][field])
    doc["metadata"]["name"] = "shared"
    doc["spec"]["transferQueue"] = {"redisUrl": redis_url}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))

    async def main() -> str:
        async with EmulatedCluster() as cluster:
            body = await cluster.create(rljob_body(manifest(redis_url)))
            assert len((await reconcile(body, cluster.api, OperatorSettings(), NOW, LOG)).actions) == 11
            return body["metadata"]["uid"]

    uid = asyncio.run(main())
    redis_client.set(kv_key("shared", "requests"), b"its work")  # no heartbeat yet: its pods are starting
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", str(tmp_path / "job.yaml"), "--no-ray",
                           "--device", "cpu", "--steps", "1", "--out", str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    assert (done.returncode, done.stdout) == (2, ""), done.stdout + done.stderr
    assert done.stderr == (f"omnirl run: metadata.name: job 'shared' on 127.0.0.1:{port} (spec.transferQueue.redisUrl) "
                           f"is claimed by RLJob team-a/shared (uid {uid}), which its operator runs, and starting here "
                           "would delete or take over its work: give this run another metadata.name, or let that "
                           f"RLJob finish or delete it (the claim is released then; it lapses {OWNER_TTL_S} s after its "
                           "last reconcile if its operator is gone)\n")
    assert redis_client.get(kv_key("shared", "requests")) == b"its work" and not out.exists()


@pytest.mark.parametrize("record", [True, False], ids=["omnirl-run", "older-launcher-no-record"])
def test_deleting_a_waiting_rljob_leaves_the_other_runs_keys_and_the_operator_says_why(redis_client, redis_url,
                                                                                      tmp_path, record):
    """kopf end to end: the RLJob waits (RedisNameInUse, its Warning event names the local run), then is deleted;
    its finalizer used to delete ``omnirl:{job}:*`` whoever they belonged to: the live local run's streams. A run
    of an older launcher leaves no record, only its roles' beats: found by hand, the finalizer of an RLJob that
    waited on it deleted its keys (3: its beats and kv:actor_state)."""
    from omnirl.transfer.owner import NO_RECORD
    from omnirl_operator.testing import BackgroundCluster

    if record:
        claim_run(redis_url, job_from_dict(manifest(redis_url)), tmp_path / "out").close()
    beat(redis_client, "actor-0")
    redis_client.set(kv_key("shared", "actor_state"), b'{"step": 3}')

    async def scenario(cluster: EmulatedCluster) -> list:
        await cluster.create(rljob_body(manifest(redis_url)))

        async def waiting():
            job = await cluster.rljob("team-a", "shared")
            ready = [c for c in (job.get("status") or {}).get("conditions", []) if c["type"] == "Ready"]
            return job if ready and ready[0]["reason"] == "RedisNameInUse" else None

        await cluster.wait_for(waiting, what="Ready reason RedisNameInUse")
        await cluster.delete("omnirl.dev/v1alpha1", "RLJob", "team-a", "shared")

        async def gone():
            return await cluster.rljob("team-a", "shared") is None

        await cluster.wait_for(gone, what="RLJob released by the finalizer")

        async def events():
            got = sorted((e.raw["reason"], e.raw["message"]) for key, e in cluster.emulator.objects.items()
                         if key[0].plural == "events" and not e.deleted and e.raw["reason"] != "Pending")
            return got if len(got) >= 2 else None

        return await cluster.wait_for(events, what="the events")

    with BackgroundCluster(OperatorSettings(), resync_seconds=0.5) as bg:
        got = bg.run(scenario)
    where = f"an omnirl run on host {socket.gethostname()} (--out {tmp_path / 'out'}, pid {os.getpid()})" \
        if record else NO_RECORD
    assert [reason for reason, _ in got] == ["RedisCleanupSkipped", "RedisNameInUse"], got
    assert got[0][1] == f"the Redis keys omnirl:shared:* belong to {where}, not this RLJob: left as they are"
    assert got[1][1].startswith("metadata.name: job 'shared' is in use on the Redis "), got[1][1]
    assert where in got[1][1]
    assert redis_client.get(kv_key("shared", "actor_state")) == b'{"step": 3}'
    assert (read_owner(redis_client, "shared") or {}).get("kind") == ("omnirl run" if record else None)


def test_two_claimants_in_the_same_instant_one_wins_every_time(redis_client, redis_url, tmp_path):
    """Found by hand (real redis-server, two threads released by a barrier): the claim read the record, found
    none, and wrote its own; two RLJobs of one name both won in 158 of 200 rounds, an `omnirl run` and an
    RLJob in 108 of 200, two `omnirl run`s (whose records counted only once their roles beat) in 200 of 200;
    two real `omnirl run`s started together on one shared Redis both ran. Now the claim is WATCH/MULTI."""
    import threading

    import redis

    from omnirl.transfer.owner import claim_for_rljob

    job = job_from_dict(manifest(redis_url))

    def rljob(uid: str) -> bool:
        with redis.Redis.from_url(redis_url) as client:
            return claim_for_rljob(client, "shared", f"ns-{uid}", uid, False) is None

    def local(out: str) -> bool:
        try:
            claim_run(redis_url, job, tmp_path / out).close()
        except ValueError as err:
            assert "holds it on this Redis" in str(err) or "is claimed by RLJob" in str(err), err
            return False
        return True

    pairs = {"two RLJobs": (lambda: rljob("a"), lambda: rljob("b")),
             "omnirl run and RLJob": (lambda: local("a"), lambda: rljob("b")),
             "two omnirl runs": (lambda: local("a"), lambda: local("b"))}
    rounds = {}  # what → how many of 100 rounds 0, 1 and 2 claimants won (the fixture emptied the Redis)
    for what, (first, second) in pairs.items():
        wins = []
        for _ in range(100):
            redis_client.delete(kv_key("shared", RUN_OWNER))
            barrier, won = threading.Barrier(2), [None, None]
            threads = [threading.Thread(target=_together, args=(barrier, won, i, c))
                       for i, c in enumerate((first, second))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wins.append(sum(won))
        rounds[what] = [wins.count(n) for n in (0, 1, 2)]
    assert rounds == {what: [0, 100, 0] for what in pairs}, rounds


def _together(barrier, won: list, i: int, claimant) -> None:
    barrier.wait()  # both claimants leave the barrier in the same instant
    won[i] = claimant()


def test_an_omnirl_run_holds_its_name_from_its_claim_before_any_role_beats_until_its_lease_lapses(
        redis_client, redis_url, tmp_path):
    """Before, a launcher's record counted only while its roles beat: in the seconds to minutes before (Ray,
    judge servers, model loading) an RLJob's reconcile took the name over and a second `omnirl run` started."""
    from omnirl.transfer.owner import claim_for_rljob

    job = job_from_dict(manifest(redis_url))
    claim = claim_run(redis_url, job, tmp_path / "a", lease_s=1.5)  # renewed by its thread every 0.5 s
    try:
        time.sleep(2.0)  # past one lease: the renewals kept it
        assert claim_for_rljob(redis_client, "shared", "team-a", "u1", False) == (
            f"an omnirl run on host {socket.gethostname()} (--out {tmp_path / 'a'}, pid {os.getpid()}) is running "
            "this job on that Redis (starting: its launcher holds the claim, no role beats yet)")
    finally:
        claim.close()
    assert 0 < redis_client.pttl(kv_key("shared", RUN_OWNER)) <= 1500
    time.sleep(1.6)  # a launcher killed with SIGKILL: nothing renews its record, which lapses
    assert claim_for_rljob(redis_client, "shared", "team-a", "u1", False) is None


def test_a_launchers_record_lost_with_its_redis_is_claimed_again_and_anothers_is_left(redis_client, redis_url,
                                                                                       tmp_path, capsys):
    """Found by hand: `omnirl run` on a shared Redis that restarted without persistence mid-run said "could not
    renew this run's claim … (the record is gone or names another run); it lapses 30 s after the last renewal"
    and ran on without a record, so a second run of its name was told it was "a run that left no run-owner
    record (an omnirl older than that record, or a launcher killed …)". Now the renew thread claims it again;
    a record another run holds is left as it is, and the launcher says so."""
    from omnirl.transfer.owner import local_owner, write_owner

    job = job_from_dict(manifest(redis_url))
    claim = claim_run(redis_url, job, tmp_path / "a", lease_s=1.5)  # renewed by its thread every 0.5 s
    try:
        redis_client.flushall()  # the Redis restarted with nothing
        time.sleep(1.2)
        mine = read_owner(redis_client, "shared")
        assert (mine["out"], mine["pid"], mine["lease_s"]) == (str(tmp_path / "a"), os.getpid(), 1.5)
        assert 0 < redis_client.pttl(kv_key("shared", RUN_OWNER)) <= 1500
        other = {**local_owner(str(tmp_path / "b"), 1.5), "pid": 4242}
        write_owner(redis_client, "shared", other, ttl_s=30)  # another run took the name meanwhile
        time.sleep(1.2)
        assert read_owner(redis_client, "shared") == other  # left as it is
    finally:
        claim.close()
    lines = capsys.readouterr().out.splitlines()
    where = f"job 'shared' on 127.0.0.1:{redis_url.rsplit(':', 1)[1].split('/')[0]}"
    assert lines == [
        f"omnirl: this run's claim of {where} was gone (a Redis restarted without persistence, a lease lapsed while "
        "Redis did not answer, or the key deleted); claimed it again",
        f"omnirl: this run's claim of {where} was taken by an omnirl run on host {socket.gethostname()} (--out "
        f"{tmp_path / 'b'}, pid 4242) (its lease lapsed while this launcher did not renew it): the two runs share the "
        "job's keys; stop one of them"], lines


def test_a_suspended_rljob_keeps_its_name_and_pending_work_past_the_claims_lapse(redis_client, redis_url, tmp_path):
    """Found by hand: an RLJob suspended (spec.suspend) with its pending work in Redis renewed no claim; once it
    lapsed (120 s; 3 s there) a real `omnirl run` of that name started and deleted that work (kv:actor_state
    gone within a second). Here the operator's claim lives 3 s unless renewed, and the test reconciles the
    suspended job every 0.3 s, as the resync timer does, while the real CLI starts."""
    job_yaml = tmp_path / "job.yaml"
    doc = yaml.safe_load((REPO / "examples/ocr-awm.yaml").read_text())
    for field in ("trainPrompts", "validationPrompts"):
        doc["spec"]["data"][field] = str(REPO / "examples" / doc["spec"]["data"][field])
    doc["metadata"]["name"] = "shared"
    doc["spec"]["transferQueue"] = {"redisUrl": redis_url}
    job_yaml.write_text(yaml.safe_dump(doc))
    settings = OperatorSettings(run_owner_ttl_seconds=3.0, resync_seconds=0.3)
    out = tmp_path / "out"

    async def main() -> tuple[str, int, str, str, list[int]]:
        async with EmulatedCluster() as cluster:
            body = await cluster.create(rljob_body(manifest(redis_url)))
            status = (await reconcile(body, cluster.api, settings, NOW, LOG)).status
            assert len(children(cluster)) == 11
            redis_client.set(kv_key("shared", "actor_state"), b'{"step": 7}')  # its pending work
            body = {**body, "spec": {**body["spec"], "suspend": True}}
            ttls, started = [], time.monotonic()
            cli, got = None, None
            while cli is None or cli.returncode is None:
                status = (await reconcile({**body, "status": status}, cluster.api, settings, NOW, LOG)).status
                assert status["phase"] == "Suspended", status
                ttls.append(redis_client.pttl(kv_key("shared", RUN_OWNER)))
                if ttls[-1] <= 0 or time.monotonic() - started > 120:  # lapsed, or the run started: stop it
                    if cli is not None:
                        cli.terminate()
                        await asyncio.wait_for(got, 60)
                    raise AssertionError(f"the claim's TTLs in ms, one per reconcile: {ttls}")
                if cli is None and time.monotonic() - started > 4.0:  # past one lapse
                    cli = await asyncio.create_subprocess_exec(
                        sys.executable, "-m", "omnirl.cli", "run", str(job_yaml), "--no-ray", "--device", "cpu",
                        "--steps", "1", "--out", str(out), cwd=REPO, stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE)
                    got = asyncio.ensure_future(cli.communicate())
                await asyncio.sleep(0.3)
            stdout, stderr = await asyncio.wait_for(got, 120)
            return body["metadata"]["uid"], cli.returncode, stdout.decode(), stderr.decode(), ttls

    uid, code, stdout, stderr, ttls = asyncio.run(main())
    assert all(0 < t <= 3000 for t in ttls), ttls  # renewed on every suspended reconcile
    owner = read_owner(redis_client, "shared")
    assert (owner["uid"], owner["suspended"], owner["lease_s"]) == (uid, True, 3.0)
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    assert (code, stdout) == (2, ""), stdout + stderr
    assert stderr == (f"omnirl run: metadata.name: job 'shared' on 127.0.0.1:{port} (spec.transferQueue.redisUrl) "
                      f"is claimed by RLJob team-a/shared (uid {uid}), which is suspended (spec.suspend) with its "
                      "pending work in this Redis, and starting here would delete it: give this run another "
                      "metadata.name, or resume that RLJob (spec.suspend: false) or delete it\n")
    assert redis_client.get(kv_key("shared", "actor_state")) == b'{"step": 7}' and not out.exists()


def test_a_finished_rljob_releases_its_name_at_once_and_only_its_own_record(redis_client, redis_url, tmp_path):
    """Found by hand: a Succeeded RLJob's claim stayed 119 s; `omnirl run` of that name right after was refused,
    "claimed by RLJob team-a/shared …, which its operator runs … let that RLJob finish". Now the reconcile in
    which it finishes (Succeeded or Failed) releases it; a record of another run is never released."""
    from omnirl.launch.preflight import check_not_running_elsewhere
    from omnirl.transfer.owner import is_rljob, release
    from omnirl_operator.redis_cleanup import cleanup_job

    local = job_from_dict(manifest(redis_url))

    async def main() -> None:
        async with EmulatedCluster() as cluster:
            for name, condition in (("done", "Complete"), ("failed", "Failed")):
                doc = manifest(redis_url)
                doc["metadata"]["name"] = name
                doc["spec"]["failurePolicy"] = {"maxRestarts": 0}  # a failed controller fails the job
                body = await cluster.create(rljob_body(doc))
                first = await reconcile(body, cluster.api, OperatorSettings(), NOW, LOG)
                assert read_owner(redis_client, name)["uid"] == body["metadata"]["uid"]
                await cluster.set_status("batch/v1", "Job", "team-a", f"{name}-controller",
                                         {"conditions": [{"type": condition, "status": "True"}]})
                out = await reconcile({**body, "status": first.status}, cluster.api, OperatorSettings(), NOW, LOG)
                assert out.status["phase"] == {"Complete": "Succeeded", "Failed": "Failed"}[condition]
                assert read_owner(redis_client, name) is None  # released by that reconcile
                check_not_running_elsewhere(redis_url, job_from_dict(doc), tmp_path / name)  # a rerun may start
                # a later resync of the finished job claims nothing again
                again = await reconcile({**body, "status": out.status}, cluster.api, OperatorSettings(), NOW, LOG)
                assert again.status["phase"] == out.status["phase"] and read_owner(redis_client, name) is None

            # the release deletes only its own record (WATCHed): an omnirl run's claim of the name stays
            body = await cluster.create(rljob_body(manifest(redis_url)))
            await reconcile(body, cluster.api, OperatorSettings(), NOW, LOG)
            redis_client.delete(kv_key("shared", RUN_OWNER))  # its claim lapsed (its operator was gone)
            claim_run(redis_url, local, tmp_path / "out").close()
            assert release(redis_client, "shared", is_rljob(body["metadata"]["uid"])) is False
            assert read_owner(redis_client, "shared")["kind"] == "omnirl run"
            # deleted: its finalizer leaves that run's keys; an RLJob whose record it is takes its record with them
            assert cleanup_job(redis_url, "shared", uid=body["metadata"]["uid"]).startswith("an omnirl run on host")
            redis_client.delete(kv_key("shared", RUN_OWNER))
            await reconcile({**body, "status": {}}, cluster.api, OperatorSettings(), NOW, LOG)  # claimed again
            assert cleanup_job(redis_url, "shared", uid=body["metadata"]["uid"]) > 0
            assert read_owner(redis_client, "shared") is None

    asyncio.run(main())


def test_an_older_launchers_run_without_a_record_is_named_and_its_keys_survive_a_waiting_rljobs_deletion(
        redis_client, redis_url, tmp_path):
    """A run started by an older launcher writes no record (or one without a lease): its roles' beats are the
    only sign it runs. Found by hand: an RLJob that waited on such a run (RedisNameInUse) and was then deleted
    had its finalizer delete that live run's keys (3 keys: its beats and kv:actor_state)."""
    from omnirl.launch.preflight import check_not_running_elsewhere
    from omnirl.transfer.owner import LOCAL, claim_for_rljob, write_owner
    from omnirl_operator.redis_cleanup import cleanup_job

    beat(redis_client, "actor-0", "rollout-0")
    redis_client.set(kv_key("shared", "actor_state"), b'{"step": 3}')
    job = job_from_dict(manifest(redis_url))
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    try:
        check_not_running_elsewhere(redis_url, job, tmp_path / "out")
        raise AssertionError("not refused")
    except ValueError as err:
        assert str(err).startswith(f"metadata.name: job 'shared' is running on 127.0.0.1:{port} (spec.transferQueue."
                                   "redisUrl; last heartbeats: "), err
        assert ("a run that left no run-owner record (an omnirl older than that record, or a launcher killed without "
                "stopping its roles, whose claim lapsed after 30 s) uses this Redis") in str(err), err
    assert claim_for_rljob(redis_client, "shared", "team-a", "u1", False) == (
        "a run that left no run-owner record (an omnirl older than that record, or a launcher killed without stopping "
        "its roles, whose claim lapsed after 30 s) is running this job on that Redis (heartbeats of actor-0, "
        "rollout-0 within 30 s)")
    # the RLJob waited on it (never ran there), then was deleted: the keys stay
    assert cleanup_job(redis_url, "shared", uid="u1", waiting=True).startswith("a run that left no run-owner record")
    assert redis_client.get(kv_key("shared", "actor_state")) == b'{"step": 3}'
    # an older launcher's record (no lease): live while its roles beat, not after
    write_owner(redis_client, "shared", {"kind": LOCAL, "host": "old", "out": "/o", "pid": 1, "time": 0.0})
    assert claim_for_rljob(redis_client, "shared", "team-a", "u1", False).startswith(
        "an omnirl run on host old (--out /o, pid 1) is running this job on that Redis (heartbeats of actor-0")
    redis_client.set(kv_key("shared", "stop"), b"true")  # it ended
    assert claim_for_rljob(redis_client, "shared", "team-a", "u1", False) is None


@pytest.mark.parametrize("edit", [{"algorithm": {"groupSize": 12}}, {"algorithm": {"groupSize": "many"}}],
                         ids=["reshaping-edit", "unparseable-edit"])
def test_an_rljob_whose_edit_is_refused_keeps_its_name_held_past_the_claims_lapse(redis_client, redis_url, edit):
    """Found by hand: an RLJob edited into an invalid spec (InvalidSpec: an edit that reshapes its published steps,
    or one that does not parse) returned before its claim was renewed, so 3 s later (the claim's TTL here; 120 s by
    default) the record was gone and `omnirl run` of that name could claim it while the RLJob's pods ran. A refused
    edit now renews the claim on the Redis its pods use (the spec it last applied) and changes nothing else."""
    settings = OperatorSettings(run_owner_ttl_seconds=3.0, resync_seconds=0.3)
    rljob = ("omnirl.dev/v1alpha1", "RLJob")

    async def main() -> None:
        async with EmulatedCluster() as cluster:
            await cluster.create(rljob_body(manifest(redis_url)))
            body = await cluster.rljob("team-a", "shared")
            first = await reconcile(body, cluster.api, settings, NOW, LOG)
            await cluster.patch(*rljob, "team-a", "shared", {"status": first.status}, sub="status")
            made = {k: obj.get("metadata", {}).get("resourceVersion") for k, obj in
                    ((f"{r.plural}/{n}", o) for (r, _, n), o in cluster.emulator.objects.items()
                     if r.plural not in ("events", "rljobs"))}
            assert len(made) == 11
            await cluster.patch(*rljob, "team-a", "shared", {"spec": edit})
            ttls, started = [], time.monotonic()
            while time.monotonic() - started < 4.5:  # past one lapse of the claim
                out = await reconcile(await cluster.rljob("team-a", "shared"), cluster.api, settings, NOW, LOG)
                await cluster.patch(*rljob, "team-a", "shared", {"status": out.status}, sub="status")
                ready = next(c for c in out.status["conditions"] if c["type"] == "Ready")
                assert (out.status["phase"], ready["reason"], out.actions) == ("Pending", "InvalidSpec", []), out.status
                assert out.status["message"].startswith("the edited spec is invalid and was not applied; the job "
                                                        "goes on with generation 1"), out.status["message"]
                ttls.append(redis_client.pttl(kv_key("shared", RUN_OWNER)))
                await asyncio.sleep(0.3)
            assert all(0 < t <= 3000 for t in ttls), ttls  # renewed on every refused reconcile
            owner = read_owner(redis_client, "shared")
            assert (owner["kind"], owner["uid"], owner["lease_s"], owner["suspended"]) == (
                "RLJob", body["metadata"]["uid"], 3.0, False)
            # nothing else changed: the children as they were, the job's ConfigMap still the applied spec
            now = {k: obj.get("metadata", {}).get("resourceVersion") for k, obj in
                   ((f"{r.plural}/{n}", o) for (r, _, n), o in cluster.emulator.objects.items()
                    if r.plural not in ("events", "rljobs"))}
            assert now == made
            # so an omnirl run of that name is still refused, naming the RLJob
            with pytest.raises(ValueError, match=f"RLJob team-a/shared \\(uid {body['metadata']['uid']}\\)"):
                claim_run(redis_url, job_from_dict(manifest(redis_url)), Path("/tmp/omnirl-test-out"))

    asyncio.run(main())
