"""The operator (kopf, all handlers) against kmock's KubernetesEmulator, with a real redis-server.

The emulator has no controllers: the tests play the Deployment/StatefulSet/Job controllers by
writing the children's ``status`` and check what the operator makes of it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from omnirl_operator.settings import OperatorSettings
from omnirl_operator.testing import EmulatedCluster, rljob_body

NS = "team-a"
RLJOB = ("omnirl.dev/v1alpha1", "RLJob")


def manifest(name: str = "demo", **spec: Any) -> dict[str, Any]:
    """A small valid RLJob (CPU roles) in namespace NS."""
    base = {
        "data": {"trainPrompts": "/data/train.txt"},
        "reward": [{"name": "ocr", "kind": "ocr"}],
        "algorithm": {"steps": 4, "groupSize": 4, "promptsPerStep": 2},
    }
    base.update(spec)
    return {"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob",
            "metadata": {"name": name, "namespace": NS}, "spec": base}


def run(scenario, redis_url: str = "redis://127.0.0.1:1/0", resync: float = 0.5) -> None:
    """Run ``scenario(cluster)`` with the operator started, inside one event loop."""

    async def main() -> None:
        async with EmulatedCluster() as cluster:
            await cluster.start_operator(OperatorSettings(default_redis_url=redis_url), resync_seconds=resync)
            await scenario(cluster)

    asyncio.run(main())


async def _phase(cluster: EmulatedCluster, name: str, phase: str) -> dict:
    async def check():
        job = await cluster.rljob(NS, name)
        return job if job and (job.get("status") or {}).get("phase") == phase else None

    return await cluster.wait_for(check, what=f"phase {phase}")


async def _replicas(cluster: EmulatedCluster, kind: str, name: str, n: int) -> dict:
    async def check():
        obj = await cluster.get("apps/v1", kind, NS, name)
        return obj if obj and obj["spec"]["replicas"] == n else None

    return await cluster.wait_for(check, what=f"{kind}/{name} replicas={n}")


def test_create_builds_children_and_status_follows_readiness():
    async def scenario(cluster: EmulatedCluster) -> None:
        await cluster.create(rljob_body(manifest()))
        job = await _phase(cluster, "demo", "Pending")
        uid = job["metadata"]["uid"]
        assert job["metadata"]["finalizers"] == ["omnirl.dev/redis-cleanup"]
        assert job["status"]["readyRoles"] == "0/4" and job["status"]["observedGeneration"] == 1
        children = [("apps/v1", "Deployment", "demo-rollout"), ("apps/v1", "Deployment", "demo-reward"),
                    ("apps/v1", "StatefulSet", "demo-actor"), ("batch/v1", "Job", "demo-controller"),
                    ("v1", "ConfigMap", "demo-spec"), ("v1", "Service", "demo-actor"),
                    ("v1", "ServiceAccount", "demo-controller")]
        for api_version, kind, name in children:
            obj = await cluster.get(api_version, kind, NS, name)
            assert obj is not None, f"{kind}/{name} missing"
            assert obj["metadata"]["ownerReferences"][0]["uid"] == uid

        for kind, name in (("Deployment", "demo-rollout"), ("Deployment", "demo-reward"),
                           ("StatefulSet", "demo-actor")):
            await cluster.set_status("apps/v1", kind, NS, name, {"readyReplicas": 1})
        await cluster.set_status("batch/v1", "Job", NS, "demo-controller", {"active": 1, "ready": 1})
        job = await _phase(cluster, "demo", "Running")
        assert job["status"]["readyRoles"] == "4/4"
        ready = next(c for c in job["status"]["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "AllRolesReady")
        assert job["status"]["startTime"]

        async def kopf_annotations():  # kopf keeps its own state in annotations, never in status
            job = await cluster.rljob(NS, "demo")
            return "omnirl.dev/last-handled-configuration" in (job["metadata"].get("annotations") or {})

        await cluster.wait_for(kopf_annotations, what="kopf's diff-base annotation")
        assert "kopf" not in job["status"]

        # the controller reports progress; the operator's resync must leave it alone
        await cluster.patch(*RLJOB, NS, "demo", {"status": {"step": 3, "rewardMean": 0.5}}, sub="status")

        async def message_has_step():  # the next resync mentions it, and leaves the fields alone
            job = await cluster.rljob(NS, "demo")
            return job if "step 3, reward mean 0.5" in job["status"]["message"] else None

        job = await cluster.wait_for(message_has_step, what="progress in the status message")
        assert (job["status"]["step"], job["status"]["rewardMean"]) == (3, 0.5)

        await cluster.set_status("batch/v1", "Job", NS, "demo-controller",
                                 {"conditions": [{"type": "Complete", "status": "True"}]})
        job = await _phase(cluster, "demo", "Succeeded")
        assert job["status"]["completionTime"]
        await _replicas(cluster, "Deployment", "demo-rollout", 0)  # accelerators are freed

    run(scenario)


def test_update_patches_children():
    async def scenario(cluster: EmulatedCluster) -> None:
        await cluster.create(rljob_body(manifest()))
        await _replicas(cluster, "Deployment", "demo-rollout", 1)
        spec_patch = {"metadata": {"generation": 2}, "spec": {"roles": {"rollout": {"replicas": 3}}}}
        await cluster.patch(*RLJOB, NS, "demo", spec_patch)
        await _replicas(cluster, "Deployment", "demo-rollout", 3)

        async def observed_2():
            job = await cluster.rljob(NS, "demo")
            return job["status"].get("observedGeneration") == 2 and job["status"]["roles"]["rollout"]["desired"] == 3

        await cluster.wait_for(observed_2, what="observedGeneration 2")
        cm = await cluster.get("v1", "ConfigMap", NS, "demo-spec")
        assert "replicas: 3" in cm["data"]["job.yaml"]

    run(scenario)


def test_suspend_scales_to_zero_and_resume_rebuilds():
    async def scenario(cluster: EmulatedCluster) -> None:
        await cluster.create(rljob_body(manifest()))
        await _replicas(cluster, "StatefulSet", "demo-actor", 1)
        assert await cluster.get("batch/v1", "Job", NS, "demo-controller")
        await cluster.patch(*RLJOB, NS, "demo", {"spec": {"suspend": True}})
        job = await _phase(cluster, "demo", "Suspended")
        assert job["status"]["roles"]["actor"]["desired"] == 0
        for kind, name in (("Deployment", "demo-rollout"), ("Deployment", "demo-reward"),
                           ("StatefulSet", "demo-actor")):
            await _replicas(cluster, kind, name, 0)
        assert await cluster.get("batch/v1", "Job", NS, "demo-controller") is None

        await cluster.patch(*RLJOB, NS, "demo", {"spec": {"suspend": False}})
        await _phase(cluster, "demo", "Pending")
        await _replicas(cluster, "StatefulSet", "demo-actor", 1)

        async def job_back():
            return await cluster.get("batch/v1", "Job", NS, "demo-controller")

        await cluster.wait_for(job_back, what="controller Job recreated")

    run(scenario)


def test_delete_runs_finalizer_that_clears_only_this_jobs_redis_keys(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    client.xadd("omnirl:demo:samples", {"k": b"v"})
    client.set("omnirl:demo:tensors:0:0:0", b"x")
    client.set("omnirl:demo-2:kv:policy_version", b"1")  # another job: must survive
    try:
        async def scenario(cluster: EmulatedCluster) -> None:
            await cluster.create(rljob_body(manifest()))
            await _phase(cluster, "demo", "Pending")
            await cluster.delete(*RLJOB, NS, "demo")

            async def gone():
                return await cluster.rljob(NS, "demo") is None

            await cluster.wait_for(gone, what="RLJob released by the finalizer")

        run(scenario, redis_url=redis_url)
        assert sorted(client.keys("omnirl:*")) == [b"omnirl:demo-2:kv:policy_version"]
    finally:
        client.flushdb()
        client.close()


def test_invalid_spec_fails_with_condition_naming_the_field():
    async def scenario(cluster: EmulatedCluster) -> None:
        bad = manifest("bad", algorithm={"groupSize": 1})
        await cluster.create(rljob_body(bad))
        job = await _phase(cluster, "bad", "Failed")
        failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
        assert failed["status"] == "True" and failed["reason"] == "InvalidSpec"
        assert "spec.algorithm.groupSize" in failed["message"]
        assert await cluster.get("v1", "ConfigMap", NS, "bad-spec") is None
        assert await cluster.get("apps/v1", "Deployment", NS, "bad-rollout") is None

        async def warning_event():
            events = [obj.raw for key, obj in cluster.emulator.objects.items()
                      if key[0].plural == "events" and not obj.deleted]
            return [e for e in events if e.get("reason") == "Failed" and e.get("type") == "Warning"]

        events = await cluster.wait_for(warning_event, what="a Warning event")
        assert "spec.algorithm.groupSize" in events[0]["message"]

        # fixing the spec recovers the job
        await cluster.patch(*RLJOB, NS, "bad", {"spec": {"algorithm": {"groupSize": 4}}})
        await _phase(cluster, "bad", "Pending")
        assert await cluster.get("apps/v1", "Deployment", NS, "bad-rollout") is not None

    run(scenario)


@pytest.mark.parametrize("action, phase", [("restart-job", "Pending"), ("fail-job", "Failed")])
def test_controller_failure_follows_failure_policy(action, phase):
    async def scenario(cluster: EmulatedCluster) -> None:
        await cluster.create(rljob_body(manifest(failurePolicy={"maxRestarts": 1, "controller": action})))
        await _phase(cluster, "demo", "Pending")
        failed = {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                  "message": "Job has reached the specified backoff limit"}]}
        await cluster.set_status("batch/v1", "Job", NS, "demo-controller", failed)

        async def decided():
            job = await cluster.rljob(NS, "demo")
            status = job.get("status") or {}
            done = status.get("restarts") == 1 if action == "restart-job" else status.get("phase") == "Failed"
            return job if done else None

        job = await cluster.wait_for(decided, what=f"{action} carried out")
        assert job["status"]["phase"] == phase
        if action == "fail-job":
            assert "fail-job" in job["status"]["message"]
            await _replicas(cluster, "StatefulSet", "demo-actor", 0)
            return
        # restart-job: a fresh controller Job appears, pods are rolled
        async def fresh_job():
            obj = await cluster.get("batch/v1", "Job", NS, "demo-controller")
            return obj if obj and not obj.get("status") else None

        await cluster.wait_for(fresh_job, what="a new controller Job")
        sts = await cluster.get("apps/v1", "StatefulSet", NS, "demo-actor")
        assert "omnirl.dev/restarted-at" in sts["spec"]["template"]["metadata"]["annotations"]
        # the second failure exhausts maxRestarts=1
        await cluster.set_status("batch/v1", "Job", NS, "demo-controller", failed)
        job = await _phase(cluster, "demo", "Failed")
        assert next(c for c in job["status"]["conditions"] if c["type"] == "Failed")["reason"] == "RestartsExhausted"

    run(scenario)
