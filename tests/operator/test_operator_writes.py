"""What a reconcile asks of the API server and of Redis, counted: a steady resync of a running RLJob
writes nothing, a real change still patches, the role and judge pods are read with one LIST (the role
pods' exit codes through it: tests/operator/test_storage.py, tests/operator/test_operator_kopf.py), and a
refused RLJob (a child's name taken) changes nothing but stopping its own pods. kmock's emulator
(``emulator.served`` counts requests by verb and resource) and a real redis-server.

Measured before the change on this job (a judge, a run claim, reward autoscaling; Running): each
reconcile sent 12 PATCHes (one per child, nothing changed) and 2 LISTs of pods; an RLJob refused
with NameConflict mid-run still ran the autoscaler (`autoscale: t-reward 1 -> 3 replicas` in its
actions, `kv:reward_replicas` = 3 in Redis) and renewed its claim on the job's Redis name.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections import Counter
from datetime import datetime, timedelta, timezone

import redis

from omnirl_operator.meta import ANNOTATION_APPLIED, up_to_date, with_applied_hash
from omnirl_operator.reconcile import reconcile
from omnirl_operator.settings import OperatorSettings
from omnirl_operator.testing import EmulatedCluster, rljob_body

NS = "team-w"
LOG = logging.getLogger("test")
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
RLJOB = ("omnirl.dev/v1alpha1", "RLJob")
READS = ("fetch", "list", "watch")


def manifest(name: str, redis_url: str) -> dict:
    judge = {"name": "pick", "kind": "http", "server": {"command": ["serve", "--port", "{port}"]}}
    autoscale = {"maxReplicas": 4, "targetBacklogPerReplica": 4, "scaleUpCooldownSeconds": 0,
                 "scaleDownCooldownSeconds": 0}
    return {"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": name, "namespace": NS},
            "spec": {"data": {"trainPrompts": "/data/train.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}, judge],
                     "storage": {"size": "1Gi"}, "roles": {"reward": {"replicas": 1, "autoscale": autoscale}},
                     "transferQueue": {"redisUrl": redis_url}}}


def writes(cluster: EmulatedCluster) -> dict:
    return {k: n for k, n in cluster.emulator.served.items() if k[0] not in READS}


async def step(cluster: EmulatedCluster, name: str, seconds: int, settings: OperatorSettings | None = None):
    """One reconcile, its status written back as the handler writes it (not counted)."""
    out = await reconcile(await cluster.rljob(NS, name), cluster.api, settings or OperatorSettings(),
                          NOW + timedelta(seconds=seconds), LOG)
    served = Counter(cluster.emulator.served)
    await cluster.patch(*RLJOB, NS, name, {"status": out.status}, sub="status")
    cluster.emulator.served.clear()
    cluster.emulator.served.update(served)
    return out


async def running_job(cluster: EmulatedCluster, name: str, redis_url: str) -> None:
    """Create `name` and play the kubelet until it is Running (every role and the judge ready)."""
    await cluster.create(rljob_body(manifest(name, redis_url)))
    await step(cluster, name, 0)
    await cluster.set_status("apps/v1", "Deployment", NS, f"{name}-judge-pick", {"readyReplicas": 1})
    await step(cluster, name, 1)  # creates the controller Job
    for kind, role in (("Deployment", "rollout"), ("Deployment", "reward"), ("StatefulSet", "actor")):
        await cluster.set_status("apps/v1", kind, NS, f"{name}-{role}", {"readyReplicas": 1})
    await cluster.set_status("batch/v1", "Job", NS, f"{name}-controller", {"active": 1, "ready": 1})
    assert (await step(cluster, name, 2)).status["phase"] == "Running"


async def pod_of(cluster: EmulatedCluster, kind: str, workload: str, pod_name: str, status: dict) -> None:
    """A pod of `workload`'s current template (as its ReplicaSet would make it), with `status`."""
    template = (await cluster.get("apps/v1", kind, NS, workload))["spec"]["template"]
    await cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": pod_name, "namespace": NS, "labels": template["metadata"]["labels"]},
        "spec": {"containers": [{"name": c["name"], "image": c["image"]} for c in template["spec"]["containers"]]},
        "status": status})


def test_up_to_date_ignores_what_the_server_adds_and_sees_what_the_operator_changed():
    want = with_applied_hash({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "labels": {"a": "1"}},
                              "spec": {"replicas": 1, "paused": False, "template": {"spec": {"volumes": [],
                                       "containers": [{"name": "c", "image": "i", "resources": {"limits": {"x": 1}}}]}}}})
    live = copy.deepcopy(want)
    live["status"] = {"readyReplicas": 1}  # the server's and the controllers' additions
    live["metadata"].update(uid="u", resourceVersion="7", annotations={**want["metadata"]["annotations"], "k": "v"})
    live["spec"].update(strategy={"type": "RollingUpdate"}, revisionHistoryLimit=10)
    del live["spec"]["paused"], live["spec"]["template"]["spec"]["volumes"]  # omitempty: false and [] are left out
    live["spec"]["template"]["spec"]["containers"][0].update(terminationMessagePath="/dev/termination-log")
    assert up_to_date(want, live)

    scaled = copy.deepcopy(live)
    scaled["spec"]["replicas"] = 3  # kubectl scale: patched back
    assert not up_to_date(want, scaled)
    extra = copy.deepcopy(live)
    extra["spec"]["template"]["spec"]["containers"].append({"name": "sidecar", "image": "s"})
    assert not up_to_date(want, extra)
    flag = copy.deepcopy(live)
    flag["spec"]["replicas"] = True  # not 1: JSON types differ
    assert not up_to_date(want, flag)

    # the operator stops setting a field inside a list item: every other field still matches, but the
    # hash of what it builds changed, so the merge patch goes out (and replaces the container list)
    dropped = copy.deepcopy(want)
    del dropped["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    dropped["metadata"]["annotations"].pop(ANNOTATION_APPLIED)
    assert up_to_date(dropped, live)  # what field-by-field comparison alone would say
    assert not up_to_date(with_applied_hash(dropped), live)


def test_a_steady_reconcile_writes_nothing_and_a_change_is_patched(redis_url, redis_client):
    async def main() -> None:
        async with EmulatedCluster() as cluster:
            await running_job(cluster, "w", redis_url)
            cluster.emulator.served.clear()
            out = await step(cluster, "w", 3)
            assert (out.actions, writes(cluster)) == ([], {})  # was 12 PATCHes: one per child
            assert cluster.emulator.served[("list", "pods")] == 1  # was 2: the role pods', the judge's
            reads = {k: n for k, n in cluster.emulator.served.items() if k != ("fetch", "rljobs")}  # step's own GET
            assert sum(reads.values()) == 10  # 8 LISTs of kinds, 1 of pods, the claim's GET

            await cluster.patch("apps/v1", "Deployment", NS, "w-rollout", {"spec": {"replicas": 3}})  # kubectl scale
            cluster.emulator.served.clear()
            out = await step(cluster, "w", 4)
            assert out.actions == ["patched Deployment/w-rollout"]
            assert writes(cluster) == {("update", "deployments"): 1}
            assert (await cluster.get("apps/v1", "Deployment", NS, "w-rollout"))["spec"]["replicas"] == 1

            upgraded = OperatorSettings(rollout_image="registry.example/rollout:2")  # the operator's settings
            cluster.emulator.served.clear()
            out = await step(cluster, "w", 5, upgraded)
            assert (out.actions, writes(cluster)) == (["patched Deployment/w-rollout"], {("update", "deployments"): 1})
            rollout = await cluster.get("apps/v1", "Deployment", NS, "w-rollout")
            assert rollout["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/rollout:2"
            cluster.emulator.served.clear()
            assert ((await step(cluster, "w", 6, upgraded)).actions, writes(cluster)) == ([], {})

            # the one LIST of pods still holds the judge's: one crash-looping past maxRestarts fails the job
            await pod_of(cluster, "Deployment", "w-judge-pick", "w-judge-pick-abcde", {"containerStatuses": [{
                "name": "judge", "restartCount": 4, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]})
            await pod_of(cluster, "StatefulSet", "w-actor", "w-actor-0", {"containerStatuses": [{
                "name": "actor", "restartCount": 0, "state": {"running": {}}}]})
            cluster.emulator.served.clear()
            out = await step(cluster, "w", 7, upgraded)
            failed = next(c for c in out.status["conditions"] if c["type"] == "Failed")
            assert (out.status["phase"], failed["reason"]) == ("Failed", "JudgeFailed")
            assert "judge pod w-judge-pick-abcde restarted 4 times" in failed["message"]
            assert cluster.emulator.served[("list", "pods")] == 1

    asyncio.run(main())


def redis_state(client: redis.Redis) -> dict:
    """Every key with its value (streams as their length), for before/after comparisons."""
    out = {}
    for key in sorted(client.keys()):
        kind = client.type(key)
        out[key] = client.xlen(key) if kind == b"stream" else client.get(key) if kind == b"string" else kind
    return out


def test_an_rljob_refused_for_a_taken_name_changes_nothing_but_stopping_its_pods(redis_url, redis_client):
    """Mid-run: the job's Service t-metrics was replaced by a user's, and 10 samples wait to be scored
    (3 reward workers' worth). The job fails NameConflict and stops its own pods; the autoscaler does
    not run (no `kv:reward_replicas`, no `scaled-at`, no "autoscale" action) and the job's Redis name is
    not claimed again. Before: `autoscale: t-reward 1 -> 3 replicas` and `kv:reward_replicas` = 3 for a
    job whose reward Deployment it scaled to 0 in the same reconcile."""
    user_service = {"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": "t-metrics", "namespace": NS, "labels": {"app.kubernetes.io/managed-by": "someone"}},
        "spec": {"ports": [{"port": 80}]}}

    async def main() -> None:
        async with EmulatedCluster() as cluster:
            await running_job(cluster, "t", redis_url)
            await cluster.delete("v1", "Service", NS, "t-metrics")
            await cluster.create(user_service)
            redis_client.delete("omnirl:t:kv:run_owner")  # lapsed (a 120 s TTL): would a refused job take it?
            for i in range(10):
                redis_client.xadd("omnirl:t:samples", {"i": i})
            before = redis_state(redis_client)
            out = await step(cluster, "t", 3)
            failed = next(c for c in out.status["conditions"] if c["type"] == "Failed")
            assert (out.status["phase"], failed["reason"]) == ("Failed", "NameConflict")
            assert out.actions == ["scaled Deployment/t-judge-pick to 0 (the job failed)",
                                   "scaled Deployment/t-reward to 0 (the job failed)",
                                   "scaled Deployment/t-rollout to 0 (the job failed)",
                                   "deleted Job/t-controller (the job failed: its pods stop)",
                                   "scaled StatefulSet/t-actor to 0 (the job failed)"]
            assert redis_state(redis_client) == before
            reward = await cluster.get("apps/v1", "Deployment", NS, "t-reward")
            assert reward["spec"]["replicas"] == 0 and "omnirl.dev/scaled-at" not in reward["metadata"]["annotations"]

    asyncio.run(main())


def test_an_rljob_refused_before_it_ran_leaves_redis_as_it_was(redis_url, redis_client):
    """Its first reconcile finds a child's name taken: nothing created, and the job's name on its Redis is
    not claimed (before: the run-owner record `kv:run_owner` named the refused RLJob for 120 s)."""
    async def main() -> None:
        async with EmulatedCluster() as cluster:
            await cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "r-spec", "namespace": NS},
                                  "data": {"mine": "yes"}})
            redis_client.xadd("omnirl:r:samples", {"i": 0})
            before = redis_state(redis_client)
            await cluster.create(rljob_body(manifest("r", redis_url)))
            cluster.emulator.served.clear()
            out = await step(cluster, "r", 0)
            assert (out.status["phase"], out.actions, writes(cluster)) == ("Failed", [], {})
            assert redis_state(redis_client) == before

    asyncio.run(main())


def test_the_operator_writes_nothing_while_a_running_job_is_steady(redis_url, redis_client):
    """kopf, its resync timer every 0.2 s and the status write included: once the job is Running and
    nothing changes, no request but reads (was 12 PATCHes per resync)."""
    async def main() -> None:
        async with EmulatedCluster() as cluster:
            await cluster.start_operator(OperatorSettings(), resync_seconds=0.2)
            await cluster.create(rljob_body(manifest("k", redis_url)))

            async def exists(kind: str, name: str):
                return await cluster.get("batch/v1" if kind == "Job" else "apps/v1", kind, NS, name)

            await cluster.wait_for(lambda: exists("Deployment", "k-judge-pick"), what="the judge")
            await cluster.set_status("apps/v1", "Deployment", NS, "k-judge-pick", {"readyReplicas": 1})
            await cluster.wait_for(lambda: exists("Job", "k-controller"), what="the controller Job")
            for kind, role in (("Deployment", "rollout"), ("Deployment", "reward"), ("StatefulSet", "actor")):
                await cluster.set_status("apps/v1", kind, NS, f"k-{role}", {"readyReplicas": 1})
            await cluster.set_status("batch/v1", "Job", NS, "k-controller", {"active": 1, "ready": 1})

            async def running():
                return ((await cluster.rljob(NS, "k")).get("status") or {}).get("phase") == "Running"

            await cluster.wait_for(running, what="Running")
            await asyncio.sleep(0.5)  # the reconcile that wrote Running has finished
            cluster.emulator.served.clear()

            async def resynced() -> bool:  # the reconcile's first and last reads: whole resyncs
                return min(cluster.emulator.served[("list", "deployments")], cluster.emulator.served[("list", "pods")]) >= 3

            await cluster.wait_for(resynced, what="three resyncs")
            assert writes(cluster) == {}

    asyncio.run(main())
