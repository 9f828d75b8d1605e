"""The operator and a job whose pods die at its end: the reconcile against kmock's emulator and a real
redis-server (the tests play the Job controller and the kubelet by writing `status` and pods).

- The controller pod killed after writing the job's `finish` record (`kv:finished`) fails its Job. Measured
  through the operator and the e2e's stand-in kubelet (`e2e/test_kubernetes_finish.py`): the failure policy
  restarted the finished job (`restarts` 1, every pod rolled, the last checkpoint exported again as
  `step-000002.1`), and with `maxRestarts: 0` the RLJob ended Failed (`RestartsExhausted`).
- A role pod restarted in place after the job's end (its `restartCount` above `maxRestarts`: a crash loop)
  failed a job whose controller Job had completed, and an actor pod restarted after the last step's result
  failed a job that had only its final validation and export left.
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import datetime, timedelta, timezone

from omnirl.transfer.keys import kv_key
from omnirl.transfer.records import FINISHED
from omnirl_operator.reconcile import reconcile
from omnirl_operator.settings import OperatorSettings
from omnirl_operator.testing import EmulatedCluster, rljob_body

NS = "team-f"
LOG = logging.getLogger("test")
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
RLJOB = ("omnirl.dev/v1alpha1", "RLJob")
RECORD = {"event": "finish", "time": 1796310179.8, "total_steps": 3, "start_step": 0,
          "last_checkpoint": "/var/lib/omnirl/checkpoints/step-000002",
          "last_export": "/var/lib/omnirl/exports/step-000002", "validation": None}


def manifest(name: str, redis_url: str, max_restarts: int) -> dict:
    return {"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": name, "namespace": NS},
            "spec": {"data": {"trainPrompts": "/data/train.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}],
                     "algorithm": {"steps": 3}, "transferQueue": {"redisUrl": redis_url},
                     "failurePolicy": {"maxRestarts": max_restarts}}}


async def step(cluster: EmulatedCluster, name: str, seconds: int):
    out = await reconcile(await cluster.rljob(NS, name), cluster.api, OperatorSettings(),
                          NOW + timedelta(seconds=seconds), LOG)
    await cluster.patch(*RLJOB, NS, name, {"status": out.status}, sub="status")
    return out


async def running(cluster: EmulatedCluster, name: str, redis_url: str, max_restarts: int) -> None:
    """The RLJob created and Running, every role ready, its controller Job active."""
    await cluster.create(rljob_body(manifest(name, redis_url, max_restarts)))
    await step(cluster, name, 0)
    for kind, role in (("Deployment", "rollout"), ("Deployment", "reward"), ("StatefulSet", "actor")):
        await cluster.set_status("apps/v1", kind, NS, f"{name}-{role}", {"readyReplicas": 1})
    await cluster.set_status("batch/v1", "Job", NS, f"{name}-controller", {"active": 1, "ready": 1})
    assert (await step(cluster, name, 1)).status["phase"] == "Running"


async def restarted_pod(cluster: EmulatedCluster, name: str, role: str, kind: str, restarts: int) -> None:
    """A pod of `role`'s current template whose container the kubelet restarted `restarts` times (last exit 137)."""
    template = (await cluster.get("apps/v1", kind, NS, f"{name}-{role}"))["spec"]["template"]
    await cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"{name}-{role}-0", "namespace": NS, "labels": template["metadata"]["labels"],
        "annotations": template["metadata"].get("annotations") or {}},
        "spec": {"containers": [{"name": role, "image": role}]},
        "status": {"containerStatuses": [{"name": role, "restartCount": restarts, "ready": True,
                                          "state": {"running": {}},
                                          "lastState": {"terminated": {"exitCode": 137, "reason": "Error"}}}]}})


def test_a_controller_job_failed_after_the_finish_record_ends_the_rljob_succeeded(redis_client, redis_url):
    """maxRestarts 0 (and 3): the controller Job fails (BackoffLimitExceeded) after `kv:finished` holds the
    job's 3 steps: Succeeded, reason ControllerSucceeded, nothing restarted, every role scaled to zero; a record
    of fewer steps (a run resumed for more) or none leaves the failure policy as it was."""
    async def main() -> None:
        async with EmulatedCluster() as cluster:
            for name, max_restarts in (("done-0", 0), ("done-3", 3)):
                redis_client.set(kv_key(name, FINISHED), json.dumps(RECORD).encode())
                await running(cluster, name, redis_url, max_restarts)
                await cluster.set_status("batch/v1", "Job", NS, f"{name}-controller", {"conditions": [
                    {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                     "message": "Job has reached the specified backoff limit"}]})
                out = await step(cluster, name, 2)
                status = out.status
                done = next(c for c in status["conditions"] if c["type"] == "Succeeded")
                # before: Failed RestartsExhausted (maxRestarts 0), Running "restarting the job (1/3)" (3)
                assert (status["phase"], done["reason"], status["restarts"]) == ("Succeeded", "ControllerSucceeded", 0)
                assert status["message"] == (
                    "the controller finished the job (3 training steps; its finish record at 2026-12-03 15:02:59 UTC, "
                    "last export /var/lib/omnirl/exports/step-000002); its pod failed after that (BackoffLimitExceeded: "
                    "Job has reached the specified backoff limit), which is not restarted"), status["message"]
                assert not any(a.startswith("restarted") for a in out.actions), out.actions
                for api_version, kind, role in (("apps/v1", "Deployment", "rollout"), ("apps/v1", "Deployment",
                                                "reward"), ("apps/v1", "StatefulSet", "actor")):
                    assert (await cluster.get(api_version, kind, NS, f"{name}-{role}"))["spec"]["replicas"] == 0
                assert (await step(cluster, name, 3)).status["phase"] == "Succeeded"  # a record that stays

            for name, record in (("short", {**RECORD, "total_steps": 2}), ("none", None)):
                if record is not None:
                    redis_client.set(kv_key(name, FINISHED), json.dumps(record).encode())
                await running(cluster, name, redis_url, 3)
                await cluster.set_status("batch/v1", "Job", NS, f"{name}-controller", {"conditions": [
                    {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]})
                out = await step(cluster, name, 2)
                assert (out.status["phase"], out.status["restarts"]) == ("Running", 1), out.status
                assert f"restarted job {name}" in out.actions

    asyncio.run(main())


def test_pods_restarted_at_the_end_of_the_job_do_not_fail_it(redis_client, redis_url):
    """maxRestarts 0. A rollout pod restarted once (137) once the controller Job completed: Succeeded (before:
    Failed, RestartsExhausted). The actor pod restarted once after the last step's result (status.step 3 of 3):
    the job goes on to its export (before: Failed); before the last step the same pod fails it, as before."""
    async def main() -> None:
        async with EmulatedCluster() as cluster:
            await running(cluster, "end", redis_url, 0)
            await restarted_pod(cluster, "end", "rollout", "Deployment", 1)
            await cluster.set_status("batch/v1", "Job", NS, "end-controller", {"conditions": [
                {"type": "Complete", "status": "True"}]})
            status = (await step(cluster, "end", 2)).status
            assert (status["phase"], status["restarts"]) == ("Succeeded", 0), status["message"]

            for name, trained in (("last", 3), ("early", 2)):
                await running(cluster, name, redis_url, 0)
                await cluster.patch(*RLJOB, NS, name, {"status": {"step": trained}}, sub="status")
                await restarted_pod(cluster, name, "actor", "StatefulSet", 1)
                status = (await step(cluster, name, 2)).status
                if trained == 3:
                    assert (status["phase"], status["restarts"]) == ("Running", 0), status["message"]
                else:
                    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
                    assert (status["phase"], failed["reason"]) == ("Failed", "RestartsExhausted"), status["message"]

    asyncio.run(main())
