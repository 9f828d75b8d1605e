"""Judge servers of an RLJob (`reward[].server`): their Deployment and Service, and readiness.

For reward ``R`` of job ``J``: Deployment and Service ``J-judge-R`` (``_`` → ``-``), port
``server.port`` named ``http``. The pods carry ``omnirl.dev/judge-of: J`` and
``omnirl.dev/reward: R`` instead of ``omnirl.dev/job`` so the job's metrics Service (which
selects every pod of the job on 9090) does not list them. The reward workers read the URL
``http://J-judge-R:<port><urlPath>`` from the wired manifest (:func:`omnirl.scorers.judges.wire`).

Start order: the controller Job is created only once every judge Deployment has a Ready pod
(:func:`judges_ready`), so no sample is scored against a judge that is still loading its model;
the rollout, reward and actor pods start meanwhile. A judge that later loses its pods leaves
the controller running: the reward workers' scorer errors fail the samples, and the groups are
refilled or dropped as for any scorer failure.
"""

from __future__ import annotations

from typing import Any

from omnirl.api.spec import RewardSpec, RLJob, judge_service_name
from omnirl.scorers.judges import VOLUME_MOUNT, argv, dns_name, judge_rewards, url, wire
from omnirl_operator.meta import child_labels, deep_merge, object_meta, pod_labels
from omnirl_operator.pods import accelerator_resources, accelerator_scheduling, pull_secrets
from omnirl_operator.settings import OperatorSettings

LABEL_JUDGE_OF = "omnirl.dev/judge-of"
LABEL_REWARD = "omnirl.dev/reward"
ROLE = "judge"
PORT_ENV = "OMNIRL_JUDGE_PORT"
STARTUP_PERIOD_S = 10  # the judge's startup probe period; its failureThreshold covers server.startupSeconds


def judge_name(job: str, reward: RewardSpec) -> str:
    """``<job>-judge-<reward>``: the judge's Deployment and Service (its length and form are checked
    when the RLJob is validated, :func:`omnirl.api.spec.judge_service_name`)."""
    return judge_service_name(job, reward.name)


def wired(job: RLJob) -> RLJob:
    """``job`` with each judge reward pointing at its Service (what the pods read)."""
    return wire(job, {r.name: url(r, judge_name(job.metadata.name, r), r.server.port) for r in judge_rewards(job)})


def _pod_labels(job: str, reward: RewardSpec) -> dict[str, str]:
    labels = {k: v for k, v in child_labels(job, ROLE).items() if not k.startswith("omnirl.dev/")}
    return {**labels, LABEL_JUDGE_OF: job, LABEL_REWARD: dns_name(reward)}


def _probe(reward: RewardSpec) -> dict[str, Any]:
    server = reward.server
    action = ({"httpGet": {"path": server.healthPath, "port": "http"}} if server.healthPath
              else {"tcpSocket": {"port": "http"}})
    return {**action, "periodSeconds": 5, "failureThreshold": 3, "timeoutSeconds": 5}


def _volumes(reward: RewardSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    server = reward.server
    if server.volume is not None:
        return [{"name": "model", **server.volume}], [{"name": "model", "mountPath": VOLUME_MOUNT, "readOnly": True}]
    if server.modelPath is not None:
        return ([{"name": "model", "hostPath": {"path": server.modelPath, "type": "Directory"}}],
                [{"name": "model", "mountPath": server.modelPath, "readOnly": True}])
    return [], []


def build_judge(job: RLJob, reward: RewardSpec, settings: OperatorSettings, *, running: bool = True
                ) -> list[dict[str, Any]]:
    """Deployment and Service of one judge (``running=False``: 0 replicas)."""
    name, server = job.metadata.name, reward.server
    child = judge_name(name, reward)
    labels = _pod_labels(name, reward)
    selector = {LABEL_JUDGE_OF: name, LABEL_REWARD: dns_name(reward)}
    volumes, mounts = _volumes(reward)
    container: dict[str, Any] = {
        "name": ROLE,
        "image": server.image or settings.image_for("reward"),
        "imagePullPolicy": settings.image_pull_policy,
        # `{port}` becomes $(OMNIRL_JUDGE_PORT), which the kubelet expands from the env (one source)
        "command": argv(server, f"$({PORT_ENV})"),
        "env": [{"name": PORT_ENV, "value": str(server.port)}, {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": [{"name": "http", "containerPort": server.port, "protocol": "TCP"}],
        "resources": accelerator_resources(server, settings),
        "volumeMounts": mounts,
        # a judge may load a large model: server.startupSeconds (default 15 minutes) before liveness counts
        "startupProbe": {**_probe(reward), "periodSeconds": STARTUP_PERIOD_S,
                         "failureThreshold": -(-server.startupSeconds // STARTUP_PERIOD_S)},
        "livenessProbe": {**_probe(reward), "periodSeconds": 20},
        "readinessProbe": _probe(reward),
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    spec: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 30,
        **accelerator_scheduling(server),
        **pull_secrets(settings),
    }
    template: dict[str, Any] = {"metadata": {"labels": labels}, "spec": spec}
    if server.template:  # user fields win, but the selector's labels stay (the Deployment needs them), and
        # those the reconcile lists the job's pods by
        template = deep_merge(template, server.template)
        template["metadata"].setdefault("labels", {}).update({**pod_labels(name), **selector})
    meta = object_meta(name, child, ROLE)
    meta["labels"][LABEL_REWARD] = dns_name(reward)
    return [
        {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
            "spec": {
                "replicas": server.replicas if running else 0,
                "selector": {"matchLabels": selector},
                "progressDeadlineSeconds": 1800,
                "revisionHistoryLimit": 3,
                "template": template,
            },
        },
        {
            "apiVersion": "v1", "kind": "Service", "metadata": object_meta(name, child, ROLE),
            "spec": {"type": "ClusterIP", "selector": selector,
                     "ports": [{"name": "http", "port": server.port, "targetPort": "http", "protocol": "TCP"}]},
        },
    ]


def build_judges(job: RLJob, settings: OperatorSettings, *, running: bool = True) -> list[dict[str, Any]]:
    """Every judge's Deployment and Service."""
    return [obj for r in judge_rewards(job) for obj in build_judge(job, r, settings, running=running)]


def judge_roles(job: RLJob, stored: dict[str, dict[str, Any]], running: bool) -> dict[str, tuple[int, int]]:
    """``{"judge-<reward>": (desired, ready)}`` from the stored Deployments (for ``status.roles``)."""
    roles = {}
    for r in judge_rewards(job):
        status = (stored.get(f"Deployment/{judge_name(job.metadata.name, r)}") or {}).get("status") or {}
        roles[f"{ROLE}-{dns_name(r)}"] = (r.server.replicas if running else 0, int(status.get("readyReplicas") or 0))
    return roles


def judges_ready(roles: dict[str, tuple[int, int]]) -> bool:
    """Every judge has at least one Ready pod (the controller may start)."""
    return all(ready >= 1 for role, (_, ready) in roles.items() if role.startswith(f"{ROLE}-"))


__all__ = ["build_judge", "build_judges", "judge_name", "judge_roles", "judges_ready",
           "wired"]
