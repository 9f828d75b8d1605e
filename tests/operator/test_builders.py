"""Pure tests of the operator's manifest builders, status computation and `omnirl render`."""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from omnirl.api.exits import FAILED, SIGNAL_EXIT_BASE, TERMINATED_EXIT
from omnirl.api.loader import job_from_dict, load_rljob
from omnirl.api.spec import FailurePolicySpec
from omnirl_operator import render
from omnirl_operator.builders import build_children
from omnirl_operator.meta import adopt, deep_merge
from omnirl_operator.settings import OperatorSettings
from omnirl_operator.status import Observed, compute_status, decide_failure, permanent_failure

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
SETTINGS = OperatorSettings(default_redis_url="redis://redis:6379/0")
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "Job")
K8S_VERSIONS = ("1.31", kubernetes_validate.utils.latest_version())
UID = "4f9d7a52-7f53-4f5a-9d9e-000000000001"


def job(name: str = "demo", roles: dict | None = None, **spec) -> object:
    base = {"data": {"trainPrompts": "prompts/train.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}]}
    if roles:
        base["roles"] = roles
    base.update(spec)
    return job_from_dict({"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob",
                          "metadata": {"name": name, "namespace": "team"}, "spec": base})


def children(j, settings: OperatorSettings = SETTINGS, **kw) -> dict[str, dict]:
    built = adopt(build_children(j, settings, **kw), j.metadata.name, "team", UID)
    return {f"{c['kind']}/{c['metadata']['name']}": c for c in built}


def container(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]["containers"][0]


def env(obj: dict) -> dict[str, object]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(obj)["env"]}


accelerators = st.one_of(
    st.just({"type": "cpu"}),
    st.just({"type": "nvidia", "count": 1}),  # a role pod uses one device (validate refuses more)
    st.just({"type": "ascend", "count": 1}),
)


@settings(max_examples=25, deadline=None)
@given(rollout=st.integers(1, 16), actor=st.integers(1, 8), acc=accelerators, suspend=st.booleans())
def test_every_child_is_owned_labelled_and_sized(rollout, actor, acc, suspend):
    j = job(roles={"rollout": {"replicas": rollout, "accelerator": acc}, "actor": {"replicas": actor}},
            suspend=suspend)
    kids = children(j)
    for obj in kids.values():
        meta = obj["metadata"]
        assert meta["namespace"] == "team"
        assert meta["ownerReferences"] == [{"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "name": "demo",
                                            "uid": UID, "controller": True, "blockOwnerDeletion": True}]
        assert meta["labels"]["app.kubernetes.io/name"] == "omnirl"
        assert meta["labels"]["app.kubernetes.io/instance"] == "demo"
        assert meta["labels"]["omnirl.dev/job"] == "demo"
    workloads = {k: v for k, v in kids.items() if k.split("/")[0] in ("Deployment", "StatefulSet", "Job")}
    for obj in workloads.values():
        role = obj["metadata"]["labels"]["omnirl.dev/role"]
        assert obj["spec"]["template"]["metadata"]["labels"]["omnirl.dev/role"] == role
        assert container(obj)["command"] == ["omnirl", "role", role, "--job", "/etc/omnirl/job.yaml"]
    assert kids["Deployment/demo-rollout"]["spec"]["replicas"] == (0 if suspend else rollout)
    assert kids["StatefulSet/demo-actor"]["spec"]["replicas"] == (0 if suspend else actor)
    assert ("Job/demo-controller" in kids) is (not suspend)
    limits = container(kids["Deployment/demo-rollout"])["resources"].get("limits", {})
    expected = {"cpu": {}, "nvidia": {"nvidia.com/gpu": acc.get("count")},
                "ascend": {"huawei.com/Ascend910": acc.get("count")}}[acc["type"]]
    assert limits == expected


def test_ascend_gets_node_selector_and_toleration_nvidia_a_toleration_cpu_requests():
    j = job(roles={"rollout": {"accelerator": {"type": "ascend", "count": 1}},
                   "actor": {"accelerator": {"type": "nvidia", "count": 1}}})
    kids = children(j)
    rollout = kids["Deployment/demo-rollout"]["spec"]["template"]["spec"]
    assert rollout["nodeSelector"] == {"accelerator": "huawei-Ascend910"}
    assert rollout["tolerations"] == [{"key": "huawei.com/Ascend910", "operator": "Exists", "effect": "NoSchedule"}]
    actor = kids["StatefulSet/demo-actor"]["spec"]["template"]["spec"]
    assert actor["tolerations"][0]["key"] == "nvidia.com/gpu" and "nodeSelector" not in actor
    reward = kids["Deployment/demo-reward"]
    assert container(reward)["resources"] == {"requests": {"cpu": "1", "memory": "2Gi"}}
    # the role's torch device follows its accelerator
    devices = {name: env(obj)["OMNIRL_DEVICE"] for name, obj in kids.items() if name.split("/")[0] in WORKLOAD_KINDS}
    assert devices == {"Deployment/demo-rollout": "npu", "StatefulSet/demo-actor": "cuda",
                       "Deployment/demo-reward": "cpu", "Job/demo-controller": "cpu"}


def test_a_node_pool_template_adds_to_the_accelerators_selector_and_toleration():
    pool = {"spec": {"nodeSelector": {"pool": "npu-a"},
                     "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "rl", "effect": "NoSchedule"}]}}
    j = job(roles={"rollout": {"accelerator": {"type": "ascend", "count": 1}, "template": pool}})
    spec = children(j)["Deployment/demo-rollout"]["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"accelerator": "huawei-Ascend910", "pool": "npu-a"}
    assert [t["key"] for t in spec["tolerations"]] == ["huawei.com/Ascend910", "dedicated"]


def test_the_default_redis_password_reaches_pods_in_any_namespace_through_the_jobs_own_secret():
    """With the chart's Redis (the operator holds its password) a job in a namespace the chart never
    saw (clusterWide) gets Secret <job>-redis, owned by the RLJob; a job naming its own Secret gets none."""
    settings = OperatorSettings(default_redis_url="redis://r:6379/0", default_redis_password="s3cret",
                                default_redis_password_secret="omnirl-redis")
    kids = children(job(), settings=settings)
    secret = kids["Secret/demo-redis"]
    assert secret["data"] == {"password": "czNjcmV0"} and secret["metadata"]["ownerReferences"][0]["uid"] == UID
    for workload in ("Deployment/demo-rollout", "Deployment/demo-reward", "StatefulSet/demo-actor",
                     "Job/demo-controller"):
        assert env(kids[workload])["REDIS_PASSWORD"] == {"secretKeyRef": {"name": "demo-redis", "key": "password"}}
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(secret, version, strict=True)
    own = children(job(transferQueue={"passwordSecret": "team-redis"}), settings=settings)
    assert not [k for k in own if k.startswith("Secret/")]
    assert env(own["Deployment/demo-rollout"])["REDIS_PASSWORD"]["secretKeyRef"]["name"] == "team-redis"
    # an operator told only the Secret's name (not the password) still points the pods at it
    named = children(job(), settings=OperatorSettings(default_redis_url="redis://r:6379/0",
                                                      default_redis_password_secret="omnirl-redis"))
    assert env(named["Job/demo-controller"])["REDIS_PASSWORD"]["secretKeyRef"]["name"] == "omnirl-redis"


def test_pull_secrets_go_to_every_pod_judges_included():
    settings = OperatorSettings.from_env({"OMNIRL_DEFAULT_REDIS_URL": "redis://r:6379/0",
                                          "OMNIRL_IMAGE_PULL_SECRETS": "regcred, mirror,"})
    assert settings.image_pull_secrets == ("regcred", "mirror")
    judge = {"name": "judge", "kind": "http", "server": {"command": ["omnirl", "scorer", "serve"]}}
    kids = children(job(reward=[{"name": "ocr", "kind": "ocr"}, judge]), settings=settings)
    pods = {k: o["spec"]["template"]["spec"] for k, o in kids.items() if k.split("/")[0] in WORKLOAD_KINDS}
    assert sorted(pods) == ["Deployment/demo-judge-judge", "Deployment/demo-reward", "Deployment/demo-rollout",
                            "Job/demo-controller", "StatefulSet/demo-actor"]
    for name, pod in pods.items():
        assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}], name
    assert "imagePullSecrets" not in children(job())["Deployment/demo-rollout"]["spec"]["template"]["spec"]


def test_runtime_contract_env_ports_probes_security():
    kids = children(job())
    rollout, actor, ctrl = kids["Deployment/demo-rollout"], kids["StatefulSet/demo-actor"], kids["Job/demo-controller"]
    e = env(rollout)
    assert e["OMNIRL_JOB_NAME"] == "demo" and e["OMNIRL_REDIS_URL"] == "redis://redis:6379/0"
    assert e["OMNIRL_WEIGHT_SYNC_ADDR"] == "demo-actor:29500"
    assert e["OMNIRL_WORKER_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert e["OMNIRL_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert (e["OMNIRL_OUT"], e["OMNIRL_METRICS_PORT"], e["OMNIRL_HEALTH_PORT"]) == ("/var/lib/omnirl", "9090", "8081")
    assert "OMNIRL_REPORT_STATUS" not in e and env(ctrl)["OMNIRL_REPORT_STATUS"] == "kubernetes"
    assert e["OMNIRL_RESUME"] == env(ctrl)["OMNIRL_RESUME"] == "auto"  # a replaced pod continues by itself
    assert {p["containerPort"] for p in container(rollout)["ports"]} == {9090, 8081}
    assert {p["containerPort"] for p in container(actor)["ports"]} == {9090, 8081, 29500}
    assert container(rollout)["livenessProbe"]["grpc"] == {"port": 8081}
    assert container(rollout)["readinessProbe"]["grpc"] == {"port": 8081}
    sc = container(rollout)["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    pod = rollout["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 1000
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    assert ctrl["spec"]["template"]["spec"]["serviceAccountName"] == "demo-controller"
    cm = yaml.safe_load(kids["ConfigMap/demo-spec"]["data"]["job.yaml"])
    assert cm["spec"]["data"]["trainPrompts"] == "/opt/omnirl/examples/prompts/train.txt"
    assert job_from_dict(cm).spec.reward[0].name == "ocr"


def test_a_compiled_jobs_model_pods_keep_torchs_compile_cache_on_the_run_volume():
    """With `model.compile` the rollout and actor pods point torch's compile cache at the run volume's
    mount, so a restarted pod finds its predecessor's kernels (a container's /tmp starts empty); the
    other roles compile nothing. A template's own TORCHINDUCTOR_CACHE_DIR replaces ours."""
    def cache_dirs(kids):
        return {name: env(obj).get("TORCHINDUCTOR_CACHE_DIR") for name, obj in kids.items()
                if name.split("/")[0] in WORKLOAD_KINDS}

    kids = children(job(model={"compile": True}))
    mount = next(m["mountPath"] for m in container(kids["Deployment/demo-rollout"])["volumeMounts"] if m["name"] == "run")
    assert cache_dirs(kids) == {"Deployment/demo-rollout": f"{mount}/cache/inductor",
                                "StatefulSet/demo-actor": f"{mount}/cache/inductor",
                                "Deployment/demo-reward": None, "Job/demo-controller": None}
    assert set(cache_dirs(children(job())).values()) == {None}
    own = {"spec": {"containers": [{"name": "rollout", "env": [{"name": "TORCHINDUCTOR_CACHE_DIR", "value": "/cache"}]}]}}
    mine = children(job(model={"compile": True}, roles={"rollout": {"template": own}}))
    assert cache_dirs(mine)["Deployment/demo-rollout"] == "/cache"


def test_scaling_does_not_roll_pods_but_a_spec_change_does():
    def digests(j):
        return {k: v["spec"]["template"]["metadata"]["annotations"]["omnirl.dev/spec-hash"]
                for k, v in children(j).items() if "template" in v.get("spec", {})}

    base = digests(job())
    assert len(set(base.values())) == 1
    assert digests(job(roles={"rollout": {"replicas": 5}})) == base
    assert digests(job(suspend=True)) == {k: v for k, v in base.items() if not k.startswith("Job/")}
    changed = digests(job(algorithm={"steps": 7}))
    assert changed.keys() == base.keys() and not set(changed.values()) & set(base.values())


def test_packed_batching_reaches_the_rollout_pods_through_the_job_manifest():
    sd3 = {"family": "sd3", "path": "/models/sd3"}
    packed = children(job(model=sd3, roles={"rollout": {"batching": "packed"}}))
    read = yaml.safe_load(packed["ConfigMap/demo-spec"]["data"]["job.yaml"])  # what `omnirl role` loads
    assert read["spec"]["roles"]["rollout"]["batching"] == "packed"
    stepwise = children(job(model=sd3))
    hash_of = "omnirl.dev/spec-hash"
    assert (packed["Deployment/demo-rollout"]["spec"]["template"]["metadata"]["annotations"][hash_of]
            != stepwise["Deployment/demo-rollout"]["spec"]["template"]["metadata"]["annotations"][hash_of])


def test_controller_role_may_patch_only_its_own_status():
    kids = children(job())
    assert kids["Role/demo-controller"]["rules"] == [
        {"apiGroups": ["omnirl.dev"], "resources": ["rljobs/status"], "resourceNames": ["demo"],
         "verbs": ["get", "patch"]}]
    binding = kids["RoleBinding/demo-controller"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "demo-controller"}]
    assert binding["roleRef"]["name"] == "demo-controller"


@pytest.mark.parametrize("action, backoff", [("restart-role", 3), ("restart-job", 0), ("fail-job", 0)])
def test_controller_job_failure_policy(action, backoff):
    """Retries per the policy, but never of a permanent exit code (3: the job failed, 4: a
    configuration error): podFailurePolicy fails the Job at once (it needs restartPolicy Never)."""
    ctrl = children(job(failurePolicy={"controller": action, "maxRestarts": 3, "activeDeadlineSeconds": 600}))
    spec = ctrl["Job/demo-controller"]["spec"]
    assert (spec["template"]["spec"]["restartPolicy"], spec["backoffLimit"]) == ("Never", backoff)
    assert spec["podFailurePolicy"] == {"rules": [{"action": "FailJob", "onExitCodes": {
        "containerName": "controller", "operator": "In", "values": [3, 4, 5]}}]}
    assert spec["activeDeadlineSeconds"] == 600
    for pod in (spec["template"], children(job())["Deployment/demo-rollout"]["spec"]["template"]):
        assert pod["spec"]["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_multi_rank_actor_rendezvous():
    kids = children(job(roles={"actor": {"replicas": 4}}))
    e = env(kids["StatefulSet/demo-actor"])
    assert (e["MASTER_ADDR"], e["MASTER_PORT"], e["WORLD_SIZE"]) == ("demo-actor-0.demo-ranks", "29400", "4")
    assert e["RANK"] == {"fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}
    ranks = kids["Service/demo-ranks"]["spec"]
    assert ranks["clusterIP"] == "None" and ranks["publishNotReadyAddresses"] is True
    assert kids["StatefulSet/demo-actor"]["spec"]["serviceName"] == "demo-ranks"
    weight_sync = kids["Service/demo-actor"]["spec"]
    assert weight_sync["selector"]["statefulset.kubernetes.io/pod-name"] == "demo-actor-0"
    # rank 0 dials its own store through this Service before it is Ready
    assert weight_sync["publishNotReadyAddresses"] is True
    assert "MASTER_ADDR" not in env(children(job())["StatefulSet/demo-actor"])


def test_user_template_wins_and_keeps_generated_fields():
    template = {
        "metadata": {"labels": {"team": "vision", "omnirl.dev/role": "hijack"}, "annotations": {"a": "b"}},
        "spec": {
            "priorityClassName": "high",
            "nodeSelector": {"pool": "h100"},
            "containers": [
                {"name": "rollout", "resources": {"limits": {"memory": "64Gi"}},
                 "env": [{"name": "OMNIRL_THREADS", "value": "8"}, {"name": "EXTRA", "value": "1"}]},
                {"name": "sidecar", "image": "busybox"},
            ],
            "volumes": [{"name": "run", "persistentVolumeClaim": {"claimName": "runs"}}],
        },
    }
    kids = children(job(roles={"rollout": {"accelerator": {"type": "nvidia", "count": 1}, "template": template}}))
    tpl = kids["Deployment/demo-rollout"]["spec"]["template"]
    assert tpl["metadata"]["labels"]["team"] == "vision"
    assert tpl["metadata"]["labels"]["omnirl.dev/role"] == "rollout"  # selector labels cannot be overridden
    assert tpl["metadata"]["annotations"]["a"] == "b" and "omnirl.dev/spec-hash" in tpl["metadata"]["annotations"]
    spec = tpl["spec"]
    assert spec["priorityClassName"] == "high" and spec["nodeSelector"] == {"pool": "h100"}
    main, sidecar = spec["containers"]
    assert sidecar == {"name": "sidecar", "image": "busybox"}
    assert main["resources"]["limits"] == {"nvidia.com/gpu": 1, "memory": "64Gi"}
    assert main["command"][:3] == ["omnirl", "role", "rollout"]
    e = {x["name"]: x.get("value") for x in main["env"]}
    # one entry per name, the user's (the ports the probes and Services use are refused: test_spec.py)
    assert e["OMNIRL_THREADS"] == "8" and e["EXTRA"] == "1" and e["OMNIRL_JOB_NAME"] == "demo"
    assert [x["name"] for x in main["env"]].count("OMNIRL_THREADS") == 1
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["run"] == {"name": "run", "persistentVolumeClaim": {"claimName": "runs"}}  # replaced, not mixed
    assert "configMap" in vols["job-spec"]


def test_deep_merge_semantics():
    base = {"a": {"b": 1, "c": [1, 2]}, "containers": [{"name": "x", "image": "i", "args": ["1"]}]}
    over = {"a": {"c": [3], "d": None}, "containers": [{"name": "x", "args": ["2"]}, {"name": "y"}]}
    assert deep_merge(base, over) == {"a": {"b": 1, "c": [3]},
                                      "containers": [{"name": "x", "image": "i", "args": ["2"]}, {"name": "y"}]}
    assert base["a"]["c"] == [1, 2]  # inputs untouched
    assert deep_merge({"a": 1, "b": 2}, {"b": None}) == {"a": 1}


def test_invalid_inputs_name_the_field():
    with pytest.raises(ValueError, match="spec.transferQueue.redisUrl"):
        build_children(job(), OperatorSettings())
    with pytest.raises(ValueError, match="OMNIRL_RESYNC_SECONDS"):
        OperatorSettings.from_env({"OMNIRL_RESYNC_SECONDS": "soon"})
    s = OperatorSettings.from_env({"OMNIRL_TRAINER_IMAGE": "reg/t:1", "OMNIRL_DEFAULT_REDIS_URL": "redis://r/0"})
    assert (s.image_for("controller"), s.image_for("rollout"), s.default_redis_url) == (
        "reg/t:1", "ghcr.io/omnirl/rollout:0.1.0", "redis://r/0")


# ---------------------------------------------------------------- status


NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


def body(status: dict | None = None, generation: int = 1) -> dict:
    return {"metadata": {"generation": generation}, "status": status or {}}


ALL_READY = {"rollout": (2, 2), "reward": (1, 1), "actor": (1, 1), "controller": (1, 1)}


def test_status_phases_conditions_and_progress_left_alone():
    pending = compute_status(body(), Observed(roles={**ALL_READY, "rollout": (2, 1)}, controller="active"), {}, NOW)
    assert (pending["phase"], pending["readyRoles"], pending["observedGeneration"]) == ("Pending", "3/4", 1)
    assert not set(pending) & {"step", "rewardMean", "policyVersion", "lastCheckpoint"}
    later = NOW + timedelta(minutes=5)
    progress = {"step": 7, "rewardMean": 0.25}
    running = compute_status(body({**pending, **progress}), Observed(roles=ALL_READY, controller="active"),
                             progress, later)
    assert running["phase"] == "Running" and running["startTime"] == "2026-01-01T12:05:00Z"
    assert "7 steps done, reward mean 0.25" in running["message"]
    conds = {c["type"]: c for c in running["conditions"]}
    assert conds["Ready"]["status"] == "True" and conds["Ready"]["lastTransitionTime"] == "2026-01-01T12:05:00Z"
    assert conds["Failed"]["lastTransitionTime"] == "2026-01-01T12:00:00Z"  # unchanged status keeps its time
    done = compute_status(body(running), Observed(roles=ALL_READY, controller="succeeded"), progress, later)
    assert done["phase"] == "Succeeded" and done["completionTime"] == "2026-01-01T12:05:00Z"
    # terminal phases stick, whatever is observed afterwards
    again = compute_status(body(done), Observed(roles=ALL_READY, controller="absent"), progress, later)
    assert again["phase"] == "Succeeded"


def test_invalid_spec_status_and_recovery():
    bad = compute_status(body(), Observed(invalid_spec=("spec.algorithm.groupSize: 1 is invalid",)), {}, NOW)
    failed = next(c for c in bad["conditions"] if c["type"] == "Failed")
    assert (bad["phase"], failed["reason"]) == ("Failed", "InvalidSpec")
    assert "spec.algorithm.groupSize" in failed["message"]
    fixed = compute_status(body(bad, generation=2), Observed(roles=ALL_READY, controller="active"), {}, NOW)
    assert fixed["phase"] == "Running" and fixed["observedGeneration"] == 2
    # an invalid edit of a live job is refused, not a failure: the pods go on with generation 2
    edited = compute_status(body(fixed, generation=3), Observed(invalid_spec=("spec.x: bad",)), {}, NOW)
    conds = {c["type"]: c for c in edited["conditions"]}
    assert (edited["phase"], edited["observedGeneration"], conds["Ready"]["reason"]) == ("Running", 2, "InvalidSpec")
    assert (edited["roles"], edited["readyRoles"]) == (fixed["roles"], "4/4")  # the pods as last seen, not 0/0
    assert conds["Failed"]["status"] == "False" and edited["message"] == (
        "the edited spec is invalid and was not applied; the job goes on with generation 2: spec.x: bad")
    # a finished job ignores edits, invalid ones too (it is not re-run after an invalid, then a valid edit)
    done = compute_status(body(fixed, generation=2), Observed(roles=ALL_READY, controller="succeeded"), {}, NOW)
    after = compute_status(body(done, generation=3), Observed(invalid_spec=("spec.x: bad",)), {}, NOW)
    assert (after["phase"], after["observedGeneration"]) == ("Succeeded", 2)
    assert after["message"].endswith("(spec generation 3 not applied: the job finished at generation 2; delete the "
                                     "RLJob and apply it again)")


@pytest.mark.parametrize("policy, restarts, role, action, reason", [
    ({"maxRestarts": 2, "controller": "restart-job"}, {}, "controller", "restart-job", "ControllerFailed"),
    ({"maxRestarts": 2, "controller": "restart-job"}, {"job": 2}, "controller", "fail", "RestartsExhausted"),
    ({"maxRestarts": 2, "actor": "fail-job"}, {}, "actor", "fail", "ActorFailed"),
    ({"maxRestarts": 2, "rollout": "restart-role"}, {"rollout": 1, "job": 2}, "rollout", "restart-role",
     "RolloutFailed"),  # each scope its own count: the job's restarts are not the rollout role's
    ({"maxRestarts": 2, "rollout": "restart-role"}, {"rollout": 2}, "rollout", "fail", "RestartsExhausted"),
    ({"maxRestarts": 2, "controller": "restart-role"}, {}, "controller", "fail", "RestartsExhausted"),
    ({"maxRestarts": 2}, {}, None, "none", ""),
])
def test_decide_failure(policy, restarts, role, action, reason):
    decision = decide_failure(FailurePolicySpec.model_validate(policy), restarts, role, "boom")
    assert (decision.action, decision.reason) == (action, reason)


def pod(role: str, code: int, message: str = "", where: str = "lastState") -> dict:
    """A role pod whose container ended with exit `code` (`lastState`: restarted in place since)."""
    ended = {"terminated": {"exitCode": code, "reason": "Error", "message": message}}
    other = {"waiting": {"reason": "CrashLoopBackOff"}} if where == "lastState" else {}
    return {"metadata": {"name": f"demo-{role}-x", "labels": {"omnirl.dev/role": role}},
            "status": {"containerStatuses": [{"name": role, "restartCount": 1, where: ended,
                                              "state" if where == "lastState" else "lastState": other}]}}


def test_permanent_exit_codes_fail_the_job_transient_ones_do_not():
    tail = "12:00:01 rollout INFO omnirl: rollout on cuda:0\nomnirl role rollout: configuration error: spec.model.path: x\n"
    decision = permanent_failure([pod("reward", 1), pod("rollout", 4, tail)], "omnirl.dev/role")
    assert (decision.action, decision.reason, decision.message) == (
        "fail", "ConfigurationError", "rollout exited 4 (a configuration error; not restarted): "
        "omnirl role rollout: configuration error: spec.model.path: x")
    controller = permanent_failure([pod("controller", 3, "", where="state")], "omnirl.dev/role")
    assert (controller.reason, controller.message) == (
        "JobFailed", "controller exited 3 (the job failed; not restarted): see kubectl logs --previous demo-controller-x")
    full = "omnirl role actor: cannot write /run/checkpoints/.tmp-step-000040/policy.safetensors ([Errno 28] No space " \
           "left on device); free space there\n"
    storage = permanent_failure([pod("actor", 5, full)], "omnirl.dev/role")
    assert (storage.action, storage.reason, storage.message) == (
        "fail", "StorageError", f"actor exited 5 (a file or the run volume cannot be read or written; not restarted): {full.strip()}")
    # a crash, an OOM kill (137), SIGTERM (143), a running pod: the failure policy decides, not this
    assert permanent_failure([pod("actor", c) for c in (FAILED, SIGNAL_EXIT_BASE + 9, TERMINATED_EXIT)] + [{"metadata": {"name": "p"}}],
                             "omnirl.dev/role") is None


# ---------------------------------------------------------------- render


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_render_examples_pass_strict_kubernetes_validation(example, monkeypatch):
    monkeypatch.setenv("OMNIRL_DEFAULT_REDIS_URL", "redis://omnirl-redis.omnirl-system:6379/0")
    out, err = io.StringIO(), io.StringIO()
    assert render.main(argparse.Namespace(job=str(example), namespace="team"), out, err) == 0, err.getvalue()
    docs = list(yaml.safe_load_all(out.getvalue()))
    name = load_rljob(example).metadata.name
    kinds = sorted(d["kind"] for d in docs if d["kind"] != "PersistentVolumeClaim")
    layout = load_rljob(example).spec.roles.rollout.parallel  # several ranks a replica: a StatefulSet (a gang: + Service)
    rollout = ["Deployment"] if layout.ranks == 1 else ["StatefulSet"] + ["Service"] * (layout.podsPerReplica > 1)
    assert kinds == sorted(["ConfigMap", "Deployment", "Job", "Role", "RoleBinding", "Service", "Service", "Service",
                            "ServiceAccount", "StatefulSet", *rollout])
    claims = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]  # spec.storage with a size
    assert len(claims) == int(bool(load_rljob(example).spec.storage))
    for doc in docs:
        assert doc["metadata"]["namespace"] == "team" and doc["metadata"]["labels"]["omnirl.dev/job"] == name
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("example", [e for e in EXAMPLES if load_rljob(e).spec.model.path != "builtin"],
                         ids=lambda p: p.name)
def test_examples_mount_their_model_in_every_role_that_loads_it(example):
    j = load_rljob(example)
    built = children(j)
    for role in ("rollout", "actor", "controller"):  # the controller loads the model's tokenizers
        pod = next(c for c in built.values() if c["metadata"]["name"] == f"{j.metadata.name}-{role}"
                   and "template" in c.get("spec", {}))
        mounts = [m["mountPath"] for m in container(pod).get("volumeMounts", [])]
        assert any(j.spec.model.path.startswith(m.rstrip("/") + "/") for m in mounts), (role, mounts)


def test_render_cli_output_passes_kubernetes_validate_strict(tmp_path):
    out = tmp_path / "rendered.yaml"
    proc = subprocess.run([sys.executable, "-m", "omnirl.cli", "render", str(ROOT / "examples" / "ocr-nft.yaml"),
                           "--namespace", "team"], capture_output=True, text=True, check=True)
    out.write_text(proc.stdout)
    tool = Path(sys.executable).parent / "kubernetes-validate"
    check = subprocess.run([str(tool), "--strict", "-k", K8S_VERSIONS[-1], str(out)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count("passed for resource") == 11 and "WARN" not in check.stdout


def test_render_reports_invalid_manifest(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: omnirl.dev/v1alpha1\nkind: RLJob\nmetadata: {name: b}\n"
                   "spec:\n  data: {trainPrompts: p.txt}\n  reward: [{name: o, kind: ocr}]\n"
                   "  algorithm: {groupSize: 1}\n")
    err = io.StringIO()
    assert render.main(argparse.Namespace(job=str(bad), namespace=None), io.StringIO(), err) == 2
    assert "spec.algorithm.groupSize" in err.getvalue()
