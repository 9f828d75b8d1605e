"""The operator (kopf) against kmock's KubernetesEmulator with a real redis-server: a judge server
the RLJob deploys gates the controller, and the reward Deployment follows the samples backlog."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from omnirl_operator.settings import OperatorSettings
from omnirl_operator.testing import BackgroundCluster, EmulatedCluster, rljob_body

NS = "team-r"
RLJOB = ("omnirl.dev/v1alpha1", "RLJob")


def manifest(name: str, **spec: Any) -> dict[str, Any]:
    base = {"data": {"trainPrompts": "/data/train.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}],
            "algorithm": {"steps": 4, "groupSize": 4, "promptsPerStep": 2}}
    base.update(spec)
    return {"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": name, "namespace": NS},
            "spec": base}


@pytest.fixture(scope="module")
def bg(redis_url):
    with BackgroundCluster(OperatorSettings(default_redis_url=redis_url), resync_seconds=1.0) as cluster:
        yield cluster


def run(bg: BackgroundCluster, scenario, name: str) -> None:
    async def wrapped(cluster: EmulatedCluster) -> None:
        try:
            await scenario(cluster)
        finally:
            await cluster.delete(*RLJOB, NS, name)

    bg.run(wrapped, timeout_s=90)


def test_controller_waits_for_the_judge_it_deploys(bg):
    name = "judged"
    server = {"command": ["python", "-m", "omnirl.reward.demo_server", "--port", "{port}"], "urlPath": "/score"}

    async def scenario(cluster: EmulatedCluster) -> None:
        await cluster.create(rljob_body(manifest(name, reward=[{"name": "j", "kind": "http", "server": server}])))

        async def judge():
            return await cluster.get("apps/v1", "Deployment", NS, f"{name}-judge-j")

        deploy = await cluster.wait_for(judge, what="the judge Deployment")
        job = await cluster.rljob(NS, name)
        assert deploy["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
        svc = await cluster.get("v1", "Service", NS, f"{name}-judge-j")
        assert svc["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]

        async def waiting():
            job = await cluster.rljob(NS, name)
            roles = (job.get("status") or {}).get("roles") or {}
            return job if "judge-j" in roles else None

        job = await cluster.wait_for(waiting, what="judge in status.roles")
        assert job["status"]["roles"]["judge-j"] == {"desired": 1, "ready": 0}
        assert "judge-j" in job["status"]["message"]
        # the other roles become ready, each seen by a later reconcile: still no controller
        for kind, role in (("Deployment", "rollout"), ("Deployment", "reward"), ("StatefulSet", "actor")):
            await cluster.set_status("apps/v1", kind, NS, f"{name}-{role}", {"readyReplicas": 1})
            await cluster.wait_for(lambda role=role: _role_ready(cluster, name, role), what=f"{role} seen ready")
            assert await cluster.get("batch/v1", "Job", NS, f"{name}-controller") is None
        await cluster.set_status("apps/v1", "Deployment", NS, f"{name}-judge-j", {"readyReplicas": 1})

        async def controller():
            return await cluster.get("batch/v1", "Job", NS, f"{name}-controller")

        await cluster.wait_for(controller, what="the controller Job once the judge is ready")
        spec = await cluster.get("v1", "ConfigMap", NS, f"{name}-spec")
        assert f"url: http://{name}-judge-j:8000/score" in spec["data"]["job.yaml"]

    run(bg, scenario, name)


async def _role_ready(cluster: EmulatedCluster, name: str, role: str) -> bool:
    """The operator's status shows ``role`` ready (a reconcile ran after its status was written)."""
    job = await cluster.rljob(NS, name)
    return ((job.get("status") or {}).get("roles") or {}).get(role, {}).get("ready") == 1


def test_reward_deployment_follows_the_samples_backlog(bg, redis_url):
    name = "scaled"
    autoscale = {"minReplicas": 1, "maxReplicas": 4, "targetBacklogPerReplica": 4, "scaleUpCooldownSeconds": 0,
                 "scaleDownCooldownSeconds": 0}
    client = redis.Redis.from_url(redis_url)
    stream = f"omnirl:{name}:samples"

    async def replicas(cluster: EmulatedCluster, n: int) -> dict:
        async def check():
            obj = await cluster.get("apps/v1", "Deployment", NS, f"{name}-reward")
            job = await cluster.rljob(NS, name)
            desired = (((job or {}).get("status") or {}).get("roles") or {}).get("reward", {}).get("desired")
            return obj if obj and obj["spec"]["replicas"] == n and desired == n else None

        return await cluster.wait_for(check, what=f"reward replicas {n} in spec and status")

    async def scenario(cluster: EmulatedCluster) -> None:
        await cluster.create(rljob_body(manifest(name, roles={"reward": {"replicas": 1, "autoscale": autoscale}})))
        await replicas(cluster, 1)
        for i in range(10):  # 10 samples the reward workers have not read: ceil(10 / 4) = 3 workers
            client.xadd(stream, {"i": i})
        client.xgroup_create(stream, "reward", id="0")
        deploy = await replicas(cluster, 3)
        assert "omnirl.dev/scaled-at" in deploy["metadata"]["annotations"]
        assert client.get(f"omnirl:{name}:kv:reward_replicas") == b"3"  # what the controller reports
        got = client.xreadgroup("reward", "w", {stream: ">"}, count=10)
        client.xack(stream, "reward", *[entry_id for entry_id, _ in got[0][1]])  # all scored
        await replicas(cluster, 1)

    try:
        run(bg, scenario, name)
    finally:
        client.delete(stream)
        client.close()
