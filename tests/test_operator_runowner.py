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
from datetime import datetime, timezone
from pathlib import Path

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
REPO = Path(__file__).resolve().parents[1]


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
    claim_run(redis_url, local, tmp_path / "out")  # what the launcher writes once its run starts
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
    claim_run(redis_url, local, tmp_path / "out")
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
                           f"RLJob finish or delete it (the claim lapses {OWNER_TTL_S} s after its last reconcile)\n")
    assert redis_client.get(kv_key("shared", "requests")) == b"its work" and not out.exists()


def test_deleting_a_waiting_rljob_leaves_the_other_runs_keys_and_the_operator_says_why(redis_client, redis_url,
                                                                                      tmp_path):
    """kopf end to end: the RLJob waits (RedisNameInUse, its Warning event names the local run), then is deleted;
    its finalizer used to delete ``omnirl:{job}:*`` whoever they belonged to: the live local run's streams."""
    from omnirl_operator.testing import BackgroundCluster

    claim_run(redis_url, job_from_dict(manifest(redis_url)), tmp_path / "out")
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
    where = f"an omnirl run on host {socket.gethostname()} (--out {tmp_path / 'out'}, pid {os.getpid()})"
    assert [reason for reason, _ in got] == ["RedisCleanupSkipped", "RedisNameInUse"], got
    assert got[0][1] == f"the Redis keys omnirl:shared:* belong to {where}, not this RLJob: left as they are"
    assert got[1][1].startswith("metadata.name: job 'shared' is in use on the Redis "), got[1][1]
    assert where in got[1][1]
    assert redis_client.get(kv_key("shared", "actor_state")) == b'{"step": 3}'
    assert read_owner(redis_client, "shared")["kind"] == "omnirl run"
