"""RLJobs that never get going: a judge server that crash-loops, pods that cannot be scheduled or
pull their image, a deadline that must also cover a job that never ran. Each against kmock's
emulator, the tests playing the kubelet and the scheduler by writing the pods' status."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta, timezone

from omnirl_operator.reconcile import reconcile
from omnirl_operator.settings import OperatorSettings
from omnirl_operator.testing import EmulatedCluster, rljob_body

NS = "team-s"
LOG = logging.getLogger("test")
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
RLJOB = ("omnirl.dev/v1alpha1", "RLJob")
JUDGE = {"name": "vlm_judge", "kind": "http", "weight": 0.5,
         "server": {"image": "vllm/vllm-openai:v0.11.0", "command": ["vllm", "serve", "--port", "{port}"]}}


def manifest(name: str, failure_policy: dict, judge: bool = True) -> dict:
    rewards = [{"name": "ocr", "kind": "ocr"}] + ([JUDGE] if judge else [])
    return {"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": name, "namespace": NS},
            "spec": {"data": {"trainPrompts": "/data/train.txt"}, "reward": rewards,
                     "transferQueue": {"redisUrl": "redis://redis:6379/0"}, "failurePolicy": failure_policy}}


async def step(cluster: EmulatedCluster, name: str, seconds: int):
    """One reconcile at NOW + seconds, its status written back as the handler does."""
    out = await reconcile(await cluster.rljob(NS, name), cluster.api, OperatorSettings(),
                          NOW + timedelta(seconds=seconds), LOG)
    await cluster.patch(*RLJOB, NS, name, {"status": out.status}, sub="status")
    return out


async def pod(cluster: EmulatedCluster, workload: str, pod_name: str, status: dict) -> None:
    """A pod of ``workload``'s current template (as its ReplicaSet would make it), with ``status``."""
    template = (await cluster.get("apps/v1", "Deployment", NS, workload))["spec"]["template"]
    await cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": pod_name, "namespace": NS, "labels": template["metadata"]["labels"],
        "annotations": template["metadata"].get("annotations") or {}},
        "spec": {"containers": [{"name": c["name"], "image": c["image"]} for c in template["spec"]["containers"]]},
        "status": status})


def looping(container: str, restarts: int, reason: str = "OOMKilled", code: int = 137) -> dict:
    return {"phase": "Running", "containerStatuses": [{
        "name": container, "restartCount": restarts, "ready": False,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
        "lastState": {"terminated": {"exitCode": code, "reason": reason}}}]}


UNSCHEDULABLE = {"phase": "Pending", "conditions": [{
    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available."}]}
IMAGE_PULL = {"phase": "Pending", "containerStatuses": [{
    "name": "judge", "restartCount": 0, "ready": False,
    "state": {"waiting": {"reason": "ImagePullBackOff",
                          "message": 'Back-off pulling image "vllm/vllm-openai:v0.11.0"'}}}]}


def test_pods_that_wait_show_why_in_the_status_and_one_event_and_do_not_fail_the_job():
    """An unschedulable rollout pod (maybe waiting for the autoscaler) and a judge whose image does
    not pull: the job stays Pending (no failure), but its Ready condition and message say which pod
    waits for what (was: `waiting for pods of: ...` only), with one Warning event per change."""

    async def main() -> None:
        async with EmulatedCluster() as cluster:
            await cluster.create(rljob_body(manifest("wait", {})))
            first = await step(cluster, "wait", 0)
            assert (first.status["message"], first.events) == (
                "waiting for pods of: actor, controller, judge-vlm-judge, reward, rollout", [])
            await pod(cluster, "wait-rollout", "wait-rollout-aaaaa", UNSCHEDULABLE)
            await pod(cluster, "wait-judge-vlm-judge", "wait-judge-vlm-judge-bbbbb", IMAGE_PULL)
            out = await step(cluster, "wait", 10)
            text = ("waiting for pods of: actor, controller, judge-vlm-judge, reward, rollout; pod "
                    "wait-judge-vlm-judge-bbbbb: ImagePullBackOff: Back-off pulling image "
                    "\"vllm/vllm-openai:v0.11.0\"; pod wait-rollout-aaaaa unschedulable: 0/3 nodes are available: "
                    "3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available.")
            ready = next(c for c in out.status["conditions"] if c["type"] == "Ready")
            assert (out.status["phase"], out.status["message"]) == ("Pending", text)
            assert (ready["status"], ready["reason"], ready["message"]) == ("False", "ImagePullBackOff", text)
            assert out.events == [("Warning", "ImagePullBackOff", text)]
            again = await step(cluster, "wait", 20)
            assert again.status["message"] == text and again.events == []  # said once
            assert [c["reason"] for c in again.status["conditions"] if c["type"] == "Failed"] == ["NotFailed"]

    asyncio.run(main())


def test_a_deployment_that_cannot_create_its_pods_says_why():
    """No pod at all to look at: Pod Security admission refuses the judge's pod (a hostPath model),
    and the Deployment's ReplicaFailure condition is what the RLJob reports."""
    forbidden = ('pods "cap-judge-vlm-judge-7d9f-x" is forbidden: violates PodSecurity "restricted:latest": '
                 'restricted volume types (volume "model" uses restricted volume type "hostPath")')

    async def main() -> None:
        async with EmulatedCluster() as cluster:
            await cluster.create(rljob_body(manifest("cap", {})))
            await step(cluster, "cap", 0)
            await cluster.set_status("apps/v1", "Deployment", NS, "cap-judge-vlm-judge", {"conditions": [
                {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": forbidden}]})
            out = await step(cluster, "cap", 10)
            assert (out.status["phase"], out.events[0][:2]) == ("Pending", ("Warning", "FailedCreate"))
            assert out.status["message"] == ("waiting for pods of: actor, controller, judge-vlm-judge, reward, "
                                             f"rollout; Deployment/cap-judge-vlm-judge FailedCreate: {forbidden}")

    asyncio.run(main())


def test_a_judge_past_its_progress_deadline_says_so_naming_the_reward_and_the_fix():
    """A judge Deployment with no Ready pod for its progressDeadlineSeconds (Progressing=False,
    ProgressDeadlineExceeded: a model that never loads, a pod that never starts): the RLJob said only
    `waiting for pods of: ..., judge-vlm-judge`. Now its Ready reason is ProgressDeadlineExceeded and the
    message and one Warning event name spec.reward[1], the Deployment, the condition's message and the
    fix, followed by what the judge's pod waits for. The job is not failed (a judge has no failure
    policy; activeDeadlineSeconds bounds the wait) and nothing is restarted."""
    stalled = {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
               "message": 'ReplicaSet "late-judge-vlm-judge-5d8f" has timed out progressing.'}

    async def main() -> None:
        async with EmulatedCluster() as cluster:
            await cluster.create(rljob_body(manifest("late", {})))
            await step(cluster, "late", 0)
            for kind, role in (("Deployment", "rollout"), ("Deployment", "reward"), ("StatefulSet", "actor")):
                await cluster.set_status("apps/v1", kind, NS, f"late-{role}", {"readyReplicas": 1})
            await pod(cluster, "late-judge-vlm-judge", "late-judge-vlm-judge-aaaaa", IMAGE_PULL)
            await cluster.set_status("apps/v1", "Deployment", NS, "late-judge-vlm-judge", {"conditions": [stalled]})
            out = await step(cluster, "late", 1900)
            text = ("waiting for pods of: controller, judge-vlm-judge; spec.reward[1] (vlm_judge): judge Deployment "
                    "late-judge-vlm-judge made no progress within its progressDeadlineSeconds (1800 s): ReplicaSet "
                    "\"late-judge-vlm-judge-5d8f\" has timed out progressing; the controller starts only once every "
                    "judge is Ready. See kubectl describe pods -n team-s -l omnirl.dev/judge-of=late,"
                    "omnirl.dev/reward=vlm-judge and fix spec.reward[1].server (image, command, accelerator, "
                    "template); pod late-judge-vlm-judge-aaaaa: ImagePullBackOff: Back-off pulling image "
                    "\"vllm/vllm-openai:v0.11.0\"")
            ready = next(c for c in out.status["conditions"] if c["type"] == "Ready")
            assert (out.status["phase"], out.status["message"]) == ("Pending", text)
            assert (ready["reason"], ready["message"]) == ("ProgressDeadlineExceeded", text)
            assert out.events == [("Warning", "ProgressDeadlineExceeded", text)]
            assert not [a for a in out.actions if not a.startswith("patched")]  # nothing restarted
            again = await step(cluster, "late", 1910)
            assert (again.status["message"], again.events) == (text, [])  # said once

    asyncio.run(main())


def test_a_judge_that_crash_loops_past_the_restart_budget_fails_the_job_naming_it():
    """The controller starts only once every judge is Ready: a judge OOM-killed again and again kept
    the job Pending for ever (the crash-loop accounting covered rollout/reward/actor only). Within
    failurePolicy.maxRestarts it is a waiting reason; past it the job fails (JudgeFailed) with
    spec.reward[1], the pod, its last exit and the fix, and every workload is scaled to zero."""

    async def main() -> None:
        async with EmulatedCluster() as cluster:
            await cluster.create(rljob_body(manifest("oom", {"maxRestarts": 2})))
            await step(cluster, "oom", 0)
            await pod(cluster, "oom-judge-vlm-judge", "oom-judge-vlm-judge-aaaaa", looping("judge", 2))
            out = await step(cluster, "oom", 10)
            assert (out.status["phase"], out.status["restarts"]) == ("Pending", 0)
            assert out.status["message"].endswith("; pod oom-judge-vlm-judge-aaaaa: CrashLoopBackOff (restarted 2 "
                                                  "times, last exit 137: OOMKilled)")
            await cluster.delete("v1", "Pod", NS, "oom-judge-vlm-judge-aaaaa")
            await pod(cluster, "oom-judge-vlm-judge", "oom-judge-vlm-judge-aaaaa", looping("judge", 3))
            out = await step(cluster, "oom", 20)
            failed = next(c for c in out.status["conditions"] if c["type"] == "Failed")
            assert (out.status["phase"], failed["reason"]) == ("Failed", "JudgeFailed")
            assert failed["message"] == (
                "spec.reward[1] (vlm_judge): judge pod oom-judge-vlm-judge-aaaaa restarted 3 times (last exit 137: "
                "OOMKilled), more than failurePolicy.maxRestarts (2); the controller starts only once every judge is "
                "Ready. It ran out of memory: raise the judge container's memory limit in "
                "spec.reward[1].server.template (or use a smaller model); then delete the RLJob and apply it again")
            for name in ("oom-judge-vlm-judge", "oom-rollout", "oom-reward"):
                assert (await cluster.get("apps/v1", "Deployment", NS, name))["spec"]["replicas"] == 0

            await cluster.create(rljob_body(manifest("crash", {"maxRestarts": 0})))
            await step(cluster, "crash", 0)
            await pod(cluster, "crash-judge-vlm-judge", "crash-judge-vlm-judge-ccccc", looping("judge", 1, "Error", 1))
            message = (await step(cluster, "crash", 5)).status["message"]
            assert message.endswith("(last exit 1: Error), more than failurePolicy.maxRestarts (0); the controller "
                                    "starts only once every judge is Ready. See kubectl logs -n team-s "
                                    "crash-judge-vlm-judge-ccccc --previous, and fix spec.reward[1].server (image, "
                                    "command, args, model); then delete the RLJob and apply it again")

    asyncio.run(main())


def test_active_deadline_covers_a_job_that_never_ran_and_restarts_at_a_resume():
    """failurePolicy.activeDeadlineSeconds counted from status.startTime, set only once the job ran:
    a job whose pods never became ready never timed out. It now counts from the job's creation (the
    first reconcile), Pending included, and the message says what the job was waiting for; a resume
    from spec.suspend starts it again, as for a batch/v1 Job."""

    async def main() -> None:
        async with EmulatedCluster() as cluster:
            await cluster.create(rljob_body(manifest("never", {"activeDeadlineSeconds": 300}, judge=False)))
            await step(cluster, "never", 0)
            await pod(cluster, "never-rollout", "never-rollout-aaaaa", UNSCHEDULABLE)
            assert (await step(cluster, "never", 299)).status["phase"] == "Pending"
            out = await step(cluster, "never", 300)
            failed = next(c for c in out.status["conditions"] if c["type"] == "Failed")
            assert (out.status["phase"], failed["reason"]) == ("Failed", "DeadlineExceeded")
            assert failed["message"] == (
                "the job has been active 300 s (since its creation or resume), failurePolicy.activeDeadlineSeconds "
                "is 300 s; not restarted; it never ran: waiting for pods of: actor, controller, reward, rollout; pod "
                "never-rollout-aaaaa unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu. "
                "preemption: 0/3 nodes are available.")
            assert (await cluster.get("apps/v1", "Deployment", NS, "never-rollout"))["spec"]["replicas"] == 0

            paused = manifest("paused", {"activeDeadlineSeconds": 300}, judge=False)
            paused["spec"]["suspend"] = True
            await cluster.create(rljob_body(paused))
            assert (await step(cluster, "paused", 0)).status["phase"] == "Suspended"
            await cluster.patch(*RLJOB, NS, "paused", {"spec": {"suspend": False}})
            assert (await step(cluster, "paused", 1000)).status["phase"] == "Pending"  # resumed: counts from here
            assert (await step(cluster, "paused", 1299)).status["phase"] == "Pending"
            assert (await step(cluster, "paused", 1300)).status["phase"] == "Failed"

    asyncio.run(main())
