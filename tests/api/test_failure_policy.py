"""`spec.failurePolicy`: one decision (`omnirl.api.failure_policy`) that `omnirl run`'s supervisor and the operator
both carry out, restarts counted per scope (the job's own, and each unit a `restart-role` restarts).

Before, the two counted differently: the supervisor per scope, as `maxRestarts` documents, and the operator every
restart of the job and of any role against one `status.restarts`. With `maxRestarts: 1`, a rollout failure and then
a reward failure restarted both roles under `omnirl run`, and failed the RLJob (`RestartsExhausted`) on Kubernetes.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import timedelta

from tests.operator.test_reconcile import LOG, MANIFEST, NOW, NS

from omnirl.api.failure_policy import JOB, FailureAction, count, decide
from omnirl.api.spec import FailurePolicySpec
from omnirl_operator.reconcile import reconcile
from omnirl_operator.settings import OperatorSettings
from omnirl_operator.testing import EmulatedCluster, rljob_body


def test_each_scope_is_counted_against_max_restarts_on_its_own():
    policy = FailurePolicySpec(maxRestarts=1)  # rollout, reward: restart-role; actor, controller: restart-job
    restarts: dict[str, int] = {}
    seen = []
    for role, unit in (("rollout", "rollout-0"), ("reward", "reward-0"), ("rollout", "rollout-1"),
                       ("actor", "actor-0"), ("rollout", "rollout-0"), ("controller", "controller-0")):
        decided = decide(policy, role, unit, restarts)
        restarts = count(restarts, decided)
        seen.append((decided.action, decided.scope, decided.used, decided.cause))
    assert seen == [("restart-role", "rollout-0", 0, ""), ("restart-role", "reward-0", 0, ""),
                    ("restart-role", "rollout-1", 0, ""), ("restart-job", JOB, 0, ""),
                    ("fail", "rollout-0", 1, "exhausted"), ("fail", JOB, 1, "exhausted")]
    assert restarts == {"rollout-0": 1, "reward-0": 1, "rollout-1": 1, JOB: 1}  # a fail counts nothing
    assert decide(FailurePolicySpec(maxRestarts=5, reward="fail-job"), "reward", "reward-0", {}) == \
        FailureAction("fail", "reward-0", 0, "fail-job")
    # the operator's controller Job under restart-role: its backoffLimit spent the restarts in place
    assert decide(FailurePolicySpec(controller="restart-role"), "controller", "controller", {},
                  used_up_in_place=True).cause == "exhausted"


def test_omnirl_run_restarts_a_rollout_and_then_a_reward_replica_under_max_restarts_1(tmp_path, redis_url):
    """The local supervisor with real processes: rollout-0 and reward-0 each exit 1 at their first start; with
    `maxRestarts: 1` each is restarted once (its own scope) and the job finishes (the controller exits 0)."""
    from omnirl.api.loader import job_from_dict
    from omnirl.launch.procs import RoleProcess, _Child
    from omnirl.launch.supervise import Supervisor
    from omnirl.transfer import TransferQueue

    doc = json.loads(json.dumps(MANIFEST))
    doc["metadata"]["name"] = f"scopes-{os.getpid()}"
    doc["spec"]["failurePolicy"] = {"maxRestarts": 1}
    doc["spec"]["transferQueue"] = {}  # the test's Redis, given to the supervisor's queue below
    job = job_from_dict(doc)
    crash_once = ("import os, sys, time\nmark = {mark!r}\nif not os.path.exists(mark):\n"
                  "    open(mark, 'w').close(); print('crashing', flush=True); sys.exit(1)\ntime.sleep(60)")
    beating = ("import time, redis; from omnirl.transfer.heartbeat import Heartbeat; "
               f"beat = Heartbeat(redis.Redis.from_url({redis_url!r}), {job.metadata.name!r}, 'controller', "
               "'controller-0', every_s=0.2)\nfor _ in range(25): beat.beat(); time.sleep(0.2)")
    scripts = {"rollout": crash_once.format(mark=str(tmp_path / "rollout.crashed")),
               "reward": crash_once.format(mark=str(tmp_path / "reward.crashed")), "controller": beating}

    def start(role: str, index: int, resume: str) -> RoleProcess:
        return RoleProcess(role, index, _Child([sys.executable, "-c", scripts[role]], {"PYTHONPATH": os.environ.get(
            "PYTHONPATH", "")}, str(tmp_path / "logs" / f"{role}-{index}.log")))

    queue = TransferQueue.for_job(job.metadata.name, job.spec.transferQueue, redis_url)
    supervisor = Supervisor(job, [("rollout", 0), ("reward", 0), ("controller", 0)], start, queue, tmp_path, 1)
    try:
        code = supervisor.run()
    finally:
        supervisor.stop_all(grace_s=1.0)
        supervisor.close()
        queue.cleanup()
        queue.close()
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert (code, supervisor.failure) == (0, ""), events
    assert sorted((e["role"], e["action"], e["restarts"]) for e in events) == [
        ("reward-0", "restart-role", 1), ("rollout-0", "restart-role", 1)]
    assert supervisor.restarts == {"rollout-0": 1, "reward-0": 1}


def test_the_operator_restarts_a_rollout_and_then_a_reward_role_under_max_restarts_1():
    """The reconcile against kmock's emulator: the rollout pod crash-loops (restarted in place more than
    `maxRestarts` times: a failed role), then the reward pod does. Each role is rolled once, counted in its own
    scope (`status.restartsPerScope`), and the job goes on. Before, the reward's failure met `status.restarts` 1 =
    `maxRestarts` and failed the RLJob (`RestartsExhausted`), where `omnirl run` restarted it (the test above)."""
    name = "scopes"
    manifest = {**MANIFEST, "metadata": {"name": name, "namespace": NS},
                "spec": {**MANIFEST["spec"], "failurePolicy": {"maxRestarts": 1}}}
    rljob = ("omnirl.dev/v1alpha1", "RLJob")

    async def step(cluster: EmulatedCluster, seconds: int) -> dict:
        out = await reconcile(await cluster.rljob(NS, name), cluster.api, OperatorSettings(),
                              NOW + timedelta(seconds=seconds), LOG)
        await cluster.patch(*rljob, NS, name, {"status": out.status}, sub="status")
        return out.status

    async def looping_pod(cluster: EmulatedCluster, role: str) -> None:
        """A pod of `role`'s current template whose container the kubelet restarted twice (OOM each time)."""
        template = (await cluster.get("apps/v1", "Deployment", NS, f"{name}-{role}"))["spec"]["template"]
        await cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"{name}-{role}-aaaaa", "namespace": NS, "labels": template["metadata"]["labels"],
            "annotations": template["metadata"]["annotations"]},
            "spec": {"containers": [{"name": role, "image": role}]},
            "status": {"containerStatuses": [{"name": role, "restartCount": 2,
                                              "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                              "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}})

    async def main() -> None:
        async with EmulatedCluster() as cluster:
            await cluster.create(rljob_body(manifest))
            await step(cluster, 0)
            await looping_pod(cluster, "rollout")
            status = await step(cluster, 1)
            assert (status["restarts"], status["restartsPerScope"]) == (1, {"rollout": 1})
            assert status["message"].endswith("; restarting role rollout (1/1)"), status["message"]
            await looping_pod(cluster, "reward")
            status = await step(cluster, 2)
            failed = next(c for c in status["conditions"] if c["type"] == "Failed")
            assert (status["phase"], failed["status"]) != ("Failed", "True"), status  # before: RestartsExhausted
            assert (status["restarts"], status["restartsPerScope"]) == (2, {"reward": 1, "rollout": 1})
            assert status["message"].endswith("; restarting role reward (1/1)"), status["message"]

    asyncio.run(main())
