"""The operator (kopf, all handlers) against kmock's KubernetesEmulator, with a real redis-server.

The emulator has no controllers: the tests play the Deployment/StatefulSet/Job controllers by
writing the children's ``status`` and check what the operator makes of it.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from omnirl_operator.meta import child_labels
from omnirl_operator.settings import OperatorSettings
from omnirl_operator.testing import BackgroundCluster, EmulatedCluster, rljob_body

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


@pytest.fixture(scope="module")
def bg(redis_url):
    """One emulator + operator for the whole module (its default Redis is the test redis-server)."""
    with BackgroundCluster(OperatorSettings(default_redis_url=redis_url), resync_seconds=1.5) as cluster:
        yield cluster


def run(bg: BackgroundCluster, scenario, name: str) -> None:
    """Run ``scenario(cluster)``, then delete the test's RLJob so the operator stops resyncing it."""

    async def wrapped(cluster: EmulatedCluster) -> None:
        try:
            await scenario(cluster)
        finally:
            await cluster.delete(*RLJOB, NS, name)

    bg.run(wrapped)


async def _phase(cluster: EmulatedCluster, name: str, phase: str) -> dict:
    async def check():
        job = await cluster.rljob(NS, name)
        return job if job and (job.get("status") or {}).get("phase") == phase else None

    return await cluster.wait_for(check, what=f"phase {phase}")


async def _exists(cluster: EmulatedCluster, api_version: str, kind: str, name: str) -> dict:
    async def check():
        return await cluster.get(api_version, kind, NS, name)

    return await cluster.wait_for(check, what=f"{kind}/{name} exists")


async def _replicas(cluster: EmulatedCluster, kind: str, name: str, n: int) -> dict:
    async def check():
        obj = await cluster.get("apps/v1", kind, NS, name)
        return obj if obj and obj["spec"]["replicas"] == n else None

    return await cluster.wait_for(check, what=f"{kind}/{name} replicas={n}")


def test_create_builds_children_and_status_follows_readiness(bg):
    name = "create"

    async def scenario(cluster: EmulatedCluster) -> None:
        await cluster.create(rljob_body(manifest(name)))
        job = await _phase(cluster, name, "Pending")
        uid = job["metadata"]["uid"]
        assert job["metadata"]["finalizers"] == ["omnirl.dev/redis-cleanup"]
        assert job["status"]["readyRoles"] == "0/4" and job["status"]["observedGeneration"] == 1
        children = [("apps/v1", "Deployment", f"{name}-rollout"), ("apps/v1", "Deployment", f"{name}-reward"),
                    ("apps/v1", "StatefulSet", f"{name}-actor"), ("v1", "ConfigMap", f"{name}-spec"),
                    ("v1", "Service", f"{name}-actor"), ("v1", "ServiceAccount", f"{name}-controller"),
                    ("rbac.authorization.k8s.io/v1", "Role", f"{name}-controller")]
        for api_version, kind, child in children:
            obj = await cluster.get(api_version, kind, NS, child)
            assert obj is not None, f"{kind}/{child} missing"
            assert obj["metadata"]["ownerReferences"][0]["uid"] == uid
        await _exists(cluster, "batch/v1", "Job", f"{name}-controller")

        for kind, child in (("Deployment", "rollout"), ("Deployment", "reward"), ("StatefulSet", "actor")):
            await cluster.set_status("apps/v1", kind, NS, f"{name}-{child}", {"readyReplicas": 1})
        await cluster.set_status("batch/v1", "Job", NS, f"{name}-controller", {"active": 1, "ready": 1})
        job = await _phase(cluster, name, "Running")
        assert job["status"]["readyRoles"] == "4/4"
        ready = next(c for c in job["status"]["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "AllRolesReady")
        assert job["status"]["startTime"]

        async def kopf_annotations():  # kopf keeps its own state in annotations, never in status
            job = await cluster.rljob(NS, name)
            return "omnirl.dev/last-handled-configuration" in (job["metadata"].get("annotations") or {})

        await cluster.wait_for(kopf_annotations, what="kopf's diff-base annotation")
        assert "kopf" not in job["status"]

        # the controller reports progress; the operator's resyncs must leave it alone
        await cluster.patch(*RLJOB, NS, name, {"status": {"step": 3, "rewardMean": 0.5}}, sub="status")

        async def message_has_step():
            job = await cluster.rljob(NS, name)
            return job if "3 steps done, reward mean 0.5" in job["status"]["message"] else None

        job = await cluster.wait_for(message_has_step, what="progress in the status message")
        assert (job["status"]["step"], job["status"]["rewardMean"]) == (3, 0.5)

        await cluster.set_status("batch/v1", "Job", NS, f"{name}-controller",
                                 {"conditions": [{"type": "Complete", "status": "True"}]})
        job = await _phase(cluster, name, "Succeeded")
        assert job["status"]["completionTime"]
        assert job["status"]["step"] == 3
        await _replicas(cluster, "Deployment", f"{name}-rollout", 0)  # accelerators are freed

    run(bg, scenario, name)


def test_update_patches_children(bg):
    name = "update"

    async def scenario(cluster: EmulatedCluster) -> None:
        await cluster.create(rljob_body(manifest(name)))
        await _replicas(cluster, "Deployment", f"{name}-rollout", 1)
        controller = await _exists(cluster, "batch/v1", "Job", f"{name}-controller")
        await cluster.patch(*RLJOB, NS, name, {"spec": {"roles": {"rollout": {"replicas": 3}}}})
        await _replicas(cluster, "Deployment", f"{name}-rollout", 3)

        async def observed_2():
            status = (await cluster.rljob(NS, name))["status"]
            return status.get("observedGeneration") == 2 and status["roles"]["rollout"]["desired"] == 3

        await cluster.wait_for(observed_2, what="observedGeneration 2")
        cm = await cluster.get("v1", "ConfigMap", NS, f"{name}-spec")
        assert "replicas: 3" in cm["data"]["job.yaml"]
        # scaling a role does not restart the controller
        assert (await cluster.get("batch/v1", "Job", NS, f"{name}-controller"))["metadata"]["uid"] == \
            controller["metadata"]["uid"]
        # a spec change does: the Job's template is immutable, so it is replaced
        await cluster.patch(*RLJOB, NS, name, {"spec": {"algorithm": {"steps": 9}}})

        async def replaced():
            job = await cluster.get("batch/v1", "Job", NS, f"{name}-controller")
            return job if job and job["metadata"]["uid"] != controller["metadata"]["uid"] else None

        await cluster.wait_for(replaced, what="controller Job replaced after a spec change")

    run(bg, scenario, name)


def test_suspend_scales_to_zero_and_resume_rebuilds(bg):
    name = "suspend"

    async def scenario(cluster: EmulatedCluster) -> None:
        await cluster.create(rljob_body(manifest(name)))
        await _replicas(cluster, "StatefulSet", f"{name}-actor", 1)
        await _exists(cluster, "batch/v1", "Job", f"{name}-controller")
        await cluster.patch(*RLJOB, NS, name, {"spec": {"suspend": True}})
        job = await _phase(cluster, name, "Suspended")
        assert job["status"]["roles"]["actor"]["desired"] == 0
        for kind, child in (("Deployment", "rollout"), ("Deployment", "reward"), ("StatefulSet", "actor")):
            await _replicas(cluster, kind, f"{name}-{child}", 0)
        assert await cluster.get("batch/v1", "Job", NS, f"{name}-controller") is None

        await cluster.patch(*RLJOB, NS, name, {"spec": {"suspend": False}})
        await _phase(cluster, name, "Pending")
        await _replicas(cluster, "StatefulSet", f"{name}-actor", 1)
        await _exists(cluster, "batch/v1", "Job", f"{name}-controller")

    run(bg, scenario, name)


def test_delete_runs_finalizer_that_clears_only_this_jobs_redis_keys(bg, redis_url):
    name = "delete"
    client = redis.Redis.from_url(redis_url)
    client.xadd(f"omnirl:{name}:samples", {"k": b"v"})
    client.set(f"omnirl:{name}:tensors:0:0:0", b"x")
    client.set(f"omnirl:{name}-2:kv:policy_version", b"1")  # another job's key: must survive
    try:
        async def scenario(cluster: EmulatedCluster) -> None:
            await cluster.create(rljob_body(manifest(name)))
            await _phase(cluster, name, "Pending")
            await cluster.delete(*RLJOB, NS, name)

            async def gone():
                return await cluster.rljob(NS, name) is None

            await cluster.wait_for(gone, what="RLJob released by the finalizer")

        bg.run(scenario)
        assert sorted(client.keys(f"omnirl:{name}*")) == [f"omnirl:{name}-2:kv:policy_version".encode()]
    finally:
        client.delete(f"omnirl:{name}-2:kv:policy_version")
        client.close()


def test_delete_with_an_unparseable_redis_url_is_released_at_once_with_one_warning(bg):
    """A job whose redisUrl cannot be parsed (it is Failed with InvalidSpec) is deleted without the
    finalizer's retries (redis-py's ValueError was retried 6 times, 10 s apart: released after 50 s,
    six Error events that named no field); the cleanup it cannot do is one Warning naming the field."""
    name, ns = "bad-url", "bad-url-ns"

    async def scenario(cluster: EmulatedCluster) -> None:
        body = rljob_body(manifest(name, transferQueue={"redisUrl": "redis://redis:notaport/0"}))
        body["metadata"]["namespace"] = ns
        await cluster.create(body)

        async def failed():
            job = await cluster.rljob(ns, name)
            return job if (job.get("status") or {}).get("phase") == "Failed" else None

        await cluster.wait_for(failed, what="phase Failed")
        await cluster.delete(*RLJOB, ns, name)

        async def gone():
            return await cluster.rljob(ns, name) is None

        await cluster.wait_for(gone, what="RLJob released by the finalizer")

        async def cleanup_events():  # kopf posts events from a queue of its own: maybe after the release
            return [(e.raw["type"], e.raw["reason"], e.raw["message"]) for key, e in cluster.emulator.objects.items()
                    if key[0].plural == "events" and key[1] == ns and not e.deleted and e.raw["reason"] != "Failed"]

        cleanup = await cluster.wait_for(cleanup_events, what="the cleanup's event")
        assert len(cleanup) == 1, cleanup
        kind, reason, message = cleanup[0]
        assert (kind, reason) == ("Warning", "RedisCleanupSkipped")
        assert message.startswith('spec.transferQueue.redisUrl: "redis://redis:notaport/0" is invalid: is not a '
                                  "valid URL (Port could not be cast to integer value as 'notaport')"), message
        assert f"omnirl:{name}:* were not deleted" in message

    bg.run(scenario)


def test_invalid_spec_fails_with_condition_naming_the_field(bg):
    name = "invalid"

    async def scenario(cluster: EmulatedCluster) -> None:
        await cluster.create(rljob_body(manifest(name, algorithm={"groupSize": 1})))
        job = await _phase(cluster, name, "Failed")
        failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
        assert failed["status"] == "True" and failed["reason"] == "InvalidSpec"
        assert "spec.algorithm.groupSize" in failed["message"]
        assert await cluster.get("v1", "ConfigMap", NS, f"{name}-spec") is None
        assert await cluster.get("apps/v1", "Deployment", NS, f"{name}-rollout") is None

        # fixing the spec recovers the job
        await cluster.patch(*RLJOB, NS, name, {"spec": {"algorithm": {"groupSize": 4}}})
        await _phase(cluster, name, "Pending")
        await _exists(cluster, "apps/v1", "Deployment", f"{name}-rollout")

    run(bg, scenario, name)


def test_a_role_template_moving_the_health_port_is_refused_before_any_pod(bg):
    """OMNIRL_HEALTH_PORT in a role template's env: the operator rendered the pod with the role serving
    health on 9000 and every probe on 8081 (restarted until the job failed). Now Failed, InvalidSpec,
    naming the env entry, with no child created; removing the entry recovers the job."""
    name = "health-port"
    env = [{"name": "OMNIRL_HEALTH_PORT", "value": "9000"}]
    roles = {"rollout": {"template": {"spec": {"containers": [{"name": "rollout", "env": env}]}}}}

    async def scenario(cluster: EmulatedCluster) -> None:
        await cluster.create(rljob_body(manifest(name, roles=roles)))
        job = await _phase(cluster, name, "Failed")
        failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
        assert failed["reason"] == "InvalidSpec"
        assert failed["message"].startswith('invalid spec: spec.roles.rollout.template.spec.containers[0].env[0]: {"name": '
                                            '"OMNIRL_HEALTH_PORT", "value": "9000"} is invalid: OMNIRL_HEALTH_PORT is '
                                            "set by the operator to 8081"), failed["message"]
        assert await cluster.get("apps/v1", "Deployment", NS, f"{name}-rollout") is None

        await cluster.patch(*RLJOB, NS, name, {"spec": {"roles": {"rollout": {"template": None}}}})
        await _phase(cluster, name, "Pending")
        rollout = await _exists(cluster, "apps/v1", "Deployment", f"{name}-rollout")
        container = rollout["spec"]["template"]["spec"]["containers"][0]
        assert {"name": "OMNIRL_HEALTH_PORT", "value": "8081"} in container["env"]
        assert container["livenessProbe"]["grpc"]["port"] == 8081

    run(bg, scenario, name)


@pytest.mark.parametrize("action, phase", [("restart-job", "Pending"), ("fail-job", "Failed")])
def test_controller_failure_follows_failure_policy(bg, action, phase):
    name = f"policy-{action}"

    async def scenario(cluster: EmulatedCluster) -> None:
        await cluster.create(rljob_body(manifest(name, failurePolicy={"maxRestarts": 1, "controller": action})))
        await _phase(cluster, name, "Pending")
        await _exists(cluster, "batch/v1", "Job", f"{name}-controller")
        failed = {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                  "message": "Job has reached the specified backoff limit"}]}
        await cluster.set_status("batch/v1", "Job", NS, f"{name}-controller", failed)

        async def decided():
            status = (await cluster.rljob(NS, name)).get("status") or {}
            done = status.get("restarts") == 1 if action == "restart-job" else status.get("phase") == "Failed"
            return status if done else None

        status = await cluster.wait_for(decided, what=f"{action} carried out")
        assert status["phase"] == phase
        if action == "fail-job":
            assert "fail-job" in status["message"]
            await _replicas(cluster, "StatefulSet", f"{name}-actor", 0)
            return

        async def fresh_job():  # restart-job: a new controller Job, and the pods rolled
            obj = await cluster.get("batch/v1", "Job", NS, f"{name}-controller")
            return obj if obj and not obj.get("status") else None

        await cluster.wait_for(fresh_job, what="a new controller Job")
        sts = await cluster.get("apps/v1", "StatefulSet", NS, f"{name}-actor")
        assert "omnirl.dev/restarted-at" in sts["spec"]["template"]["metadata"]["annotations"]
        await cluster.set_status("batch/v1", "Job", NS, f"{name}-controller", failed)  # exhausts maxRestarts=1
        job = await _phase(cluster, name, "Failed")
        assert next(c for c in job["status"]["conditions"] if c["type"] == "Failed")["reason"] == "RestartsExhausted"

    run(bg, scenario, name)


def test_phase_transitions_post_events(bg):
    """The first event of the job's own namespace is the transition to Failed."""
    name = "events"

    async def scenario(cluster: EmulatedCluster) -> None:
        body = rljob_body(manifest(name, algorithm={"groupSize": 1}))
        body["metadata"]["namespace"] = "events-ns"
        await cluster.create(body)

        async def warning_event():
            return [obj.raw for key, obj in cluster.emulator.objects.items()
                    if key[0].plural == "events" and key[1] == "events-ns" and not obj.deleted]

        events = await cluster.wait_for(warning_event, what="an event")
        assert (events[0]["type"], events[0]["reason"]) == ("Warning", "Failed")
        assert "spec.algorithm.groupSize" in events[0]["message"]
        assert events[0]["involvedObject"]["name"] == name
        await cluster.delete(*RLJOB, "events-ns", name)

    bg.run(scenario)


@pytest.mark.parametrize("role,code", [("rollout", 4), ("controller", 4), ("actor", 5)])
def test_a_configuration_error_fails_the_job_with_its_message_instead_of_restarting(bg, role, code):
    """A role pod that exited CONFIG_ERROR_EXIT (4), or STORAGE_ERROR_EXIT (5: its write to the run
    volume failed for want of space): the RLJob turns Failed with the pod's last log line (its
    termination message), nothing is restarted, the workloads scale to zero. The rollout's and the
    actor's kubelet already restarted them in place (the code is in `lastState`); the controller Job
    failed through its podFailurePolicy (reason PodFailurePolicy, which alone would be a restart-job)."""
    name = f"config-{role}"
    line = (f"omnirl role {role}: configuration error: spec.model.path: /models/sd3/transformer/config.json not found"
            if code == 4 else f"omnirl role {role}: cannot write /run/checkpoints/.tmp-step-000040-7/policy.safetensors "
            "([Errno 28] No space left on device); free space there")
    reason, kind = {4: ("ConfigurationError", "a configuration error"),
                    5: ("StorageError", "a file or the run volume cannot be read or written")}[code]

    async def scenario(cluster: EmulatedCluster) -> None:
        await cluster.create(rljob_body(manifest(name, failurePolicy={"maxRestarts": 3})))
        await _phase(cluster, name, "Pending")
        await _exists(cluster, "batch/v1", "Job", f"{name}-controller")
        ended = {"terminated": {"exitCode": code, "reason": "Error", "message": f"12:00:00 {role} INFO start\n{line}\n"}}
        states = {"state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": ended} if role != "controller" \
            else {"state": ended}
        await cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"{name}-{role}-abcde", "namespace": NS,
            "labels": child_labels(name, role)},  # what its template gives it
            "spec": {"containers": [{"name": role, "image": "trainer"}]},
            "status": {"containerStatuses": [{"name": role, "restartCount": 1, **states}]}})
        if role == "controller":
            await cluster.set_status("batch/v1", "Job", NS, f"{name}-controller", {"conditions": [
                {"type": "Failed", "status": "True", "reason": "PodFailurePolicy",
                 "message": f"Container controller for pod {NS}/{name}-controller-abcde failed with exit code 4 "
                            "matching FailJob rule at index 0"}]})
        job = await _phase(cluster, name, "Failed")
        failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
        fix = "" if code == 4 else (  # the role's "free space there" is a path in the pod: the volume and its fix
            ". The actor pod's run volume is an emptyDir on its node (no spec.storage): free space on the node, or "
            "give the job a claim (spec.storage.size) large enough for the run directory and spec.checkpoint.keep "
            "(2) + 1 checkpoints; then delete the RLJob and apply it again.")
        assert (failed["reason"], failed["message"]) == (
            reason, f"{role} exited {code} ({kind}; not restarted): {line}{fix}")
        assert job["status"]["message"] == failed["message"] and job["status"]["restarts"] == 0
        await _replicas(cluster, "StatefulSet", f"{name}-actor", 0)
        sts = await cluster.get("apps/v1", "StatefulSet", NS, f"{name}-actor")
        assert "omnirl.dev/restarted-at" not in sts["spec"]["template"]["metadata"].get("annotations", {})

    run(bg, scenario, name)
