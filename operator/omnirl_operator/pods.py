"""The PodTemplateSpec of one role: the role-process contract (`omnirl.api.runtime.RoleEnv`) in manifest form.

Every role runs ``omnirl role <role> --job /etc/omnirl/job.yaml`` with the job's ConfigMap mounted
at ``/etc/omnirl``, the run volume at ``/var/lib/omnirl`` (``spec.storage``'s claim on the
controller and the actor, see :mod:`omnirl_operator.storage`), Prometheus ``/metrics`` on 9090 and the
gRPC health service on 8081 (probed by the kubelet). The user's ``roles.<role>.template`` is
merged over the generated template last (user fields win), except the selector labels, which
the workload needs to find its pods.
"""

from __future__ import annotations

import base64
import math
from typing import Any

from omnirl.api.runtime import COMPILE_CACHE, INDUCTOR_CACHE_VARIABLE, REDIS_PASSWORD, VARIABLES, RoleEnv, sync_backend
from omnirl.api.spec import MODEL_ROLES, RLJob, RoleSpec
from omnirl.api.spec_parallel import actor_world
from omnirl_operator.meta import (
    ANNOTATION_SPEC_HASH,
    child_labels,
    child_name,
    deep_merge,
    object_meta,
    pod_labels,
    selector_labels,
)
from omnirl_operator.settings import OperatorSettings
from omnirl_operator.storage import pod_affinity, run_volume

CONFIG_DIR = "/etc/omnirl"  # the job's ConfigMap `J-spec`, one file per key
JOB_KEY = "job.yaml"  # the manifest the roles run: each judge wired to its Service (`judges.py::wired`)
# the manifest as the user wrote it (judges as `reward[].server`): what the controller writes into exports
# (OMNIRL_MANIFEST); an export's job.yaml held the `J-judge-R` Service URL, gone with the RLJob
MANIFEST_KEY = "manifest.yaml"
JOB_FILE = f"{CONFIG_DIR}/{JOB_KEY}"
MANIFEST_FILE = f"{CONFIG_DIR}/{MANIFEST_KEY}"
RUN_DIR = "/var/lib/omnirl"
METRICS_PORT = 9090
HEALTH_PORT = 8081
WEIGHT_SYNC_PORT = 29500
DIST_PORT = 29400  # torch.distributed rendezvous of actor ranks (torchrun's c10d default)
RUN_AS_USER = 1000
STARTUP_PERIOD_S = 10  # the startup probe's periodSeconds

NVIDIA_RESOURCE = "nvidia.com/gpu"
ASCEND_RESOURCE = "huawei.com/Ascend910"
ASCEND_NODE_LABEL = ("accelerator", "huawei-Ascend910")
# OMNIRL_DEVICE (the role's torch device) per accelerator type.
TORCH_DEVICE = {"cpu": "cpu", "nvidia": "cuda", "ascend": "npu"}


def role_spec(job: RLJob, role: str) -> RoleSpec:
    """``job.spec.roles.<role>``."""
    return getattr(job.spec.roles, role)


def redis_url(job: RLJob, settings: OperatorSettings) -> str:
    """The TransferQueue URL the job's pods use: the spec's, else the operator's default.

    Raises:
        ValueError: naming ``spec.transferQueue.redisUrl`` when neither is set.
    """
    url = job.spec.transferQueue.redisUrl or settings.default_redis_url
    if not url:
        raise ValueError(
            "spec.transferQueue.redisUrl: not set and the operator has no default Redis; set it to "
            "redis://HOST:6379/0, or install the chart with redis.bundled=true or redis.externalUrl"
        )
    return url


def accelerator_resources(role: RoleSpec, settings: OperatorSettings) -> dict[str, Any]:
    """``resources`` of a role container from the accelerator sugar.

    ``nvidia`` → limits ``nvidia.com/gpu: count``; ``ascend`` → limits
    ``huawei.com/Ascend910: count``; every role also requests the operator's CPU and memory.
    """
    resources: dict[str, Any] = {"requests": {"cpu": settings.cpu_request, "memory": settings.memory_request}}
    acc = role.accelerator
    if acc.type == "nvidia":
        resources["limits"] = {NVIDIA_RESOURCE: acc.count}
    elif acc.type == "ascend":
        resources["limits"] = {ASCEND_RESOURCE: acc.count}
    return resources


def accelerator_scheduling(role: RoleSpec) -> dict[str, Any]:
    """``nodeSelector`` and ``tolerations`` for the accelerator (the device plugins' taints)."""
    acc = role.accelerator
    if acc.type == "ascend":
        return {
            "nodeSelector": {ASCEND_NODE_LABEL[0]: ASCEND_NODE_LABEL[1]},
            "tolerations": [{"key": ASCEND_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        }
    if acc.type == "nvidia":
        return {"tolerations": [{"key": NVIDIA_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]}
    return {}


def pull_secrets(settings: OperatorSettings) -> dict[str, Any]:
    """``{"imagePullSecrets": [...]}`` of every RLJob pod (``settings.image_pull_secrets``), or ``{}``."""
    if not settings.image_pull_secrets:
        return {}
    return {"imagePullSecrets": [{"name": n} for n in settings.image_pull_secrets]}


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


# RoleEnv fields a pod learns from the downward API (its own name, namespace, StatefulSet index);
# the contract is built with FROM_POD in them and the kubelet fills in the values
FROM_POD = "(downward API)"
POD_FIELDS = {"namespace": "metadata.namespace", "worker_id": "metadata.name",
              "rank": "metadata.labels['apps.kubernetes.io/pod-index']"}


def password_secret(job: RLJob, settings: OperatorSettings) -> str | None:
    """The Secret (key ``password``) the job's pods read ``REDIS_PASSWORD`` from, in the job's namespace.

    ``spec.transferQueue.passwordSecret`` when set; else, when the operator knows the default Redis's
    password, the job's own Secret ``<job>-redis`` (:func:`build_password_secret`: a job in any
    namespace, e.g. with ``clusterWide``, then finds it); else ``settings.default_redis_password_secret``
    (expected in the job's namespace); else None (no password).
    """
    if job.spec.transferQueue.passwordSecret:
        return job.spec.transferQueue.passwordSecret
    if settings.default_redis_password:
        return child_name(job.metadata.name, suffix="redis")
    return settings.default_redis_password_secret


def build_password_secret(job: RLJob, settings: OperatorSettings) -> dict[str, Any] | None:
    """Secret ``<job>-redis`` holding the default Redis's password for the job's pods, or None when
    the job names its own Secret or the operator knows no password."""
    if job.spec.transferQueue.passwordSecret or not settings.default_redis_password:
        return None
    name = job.metadata.name
    password = base64.b64encode(settings.default_redis_password.encode()).decode()
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": object_meta(name, child_name(name, suffix="redis")), "data": {"password": password}}


def role_env(job: RLJob, role: str, settings: OperatorSettings) -> list[dict[str, Any]]:
    """The container environment of ``role``: ``RoleEnv.to_environ()`` with the downward-API fields
    (``POD_FIELDS``) as ``fieldRef``s, ``REDIS_PASSWORD`` from the job's Secret when there is one, and
    for a ``model.compile`` job's rollout and actor torch's compile cache on the run volume
    (``omnirl.api.runtime.COMPILE_CACHE``; a template's own ``TORCHINDUCTOR_CACHE_DIR`` wins)."""
    name = job.metadata.name
    roles = job.spec.roles
    ranks, per_pod, hosts = model_ranks(job, role)
    contract = RoleEnv(
        job_name=name, redis_url=redis_url(job, settings), weight_sync_host=child_name(name, "actor"),
        weight_sync_port=WEIGHT_SYNC_PORT, worker_id=FROM_POD, namespace=FROM_POD, out_dir=RUN_DIR, metrics_port=METRICS_PORT,
        health_port=HEALTH_PORT, report_status="kubernetes" if role == "controller" else "",
        device=TORCH_DEVICE[role_spec(job, role).accelerator.type],
        # each pod has devices of its own: only a CPU/GPU mix needs gloo
        weight_sync_backend=sync_backend(roles.actor.accelerator.type, [roles.rollout.accelerator.type]),
        # rank r is StatefulSet pod <job>-actor-r; rank 0 hosts the rendezvous store
        world_size=ranks, master_addr=f"{child_name(name, 'actor')}-0.{child_name(name, suffix='ranks')}",
        master_port=DIST_PORT,
        # the controller exports checkpoints it can read: only when it shares the run volume with the actor
        export=job.spec.storage is not None,
        # a restarted pod continues from the job's latest complete checkpoint, if there is one
        resume="auto",
        manifest=MANIFEST_FILE,
        # a pod holding several ranks of a model role (RANK is then the pod's index), and each rollout replica's
        # rendezvous (docs/parallel.md, "On Kubernetes")
        ranks_per_pod=per_pod, replica_hosts=hosts,
    )
    plain = contract.to_environ()
    env: list[dict[str, Any]] = []
    for field, path in POD_FIELDS.items():
        var = VARIABLES[field]
        if plain.pop(var, None) is not None:  # RANK only with several actor ranks
            env.append(_field_env(var, path))
    env += [{"name": k, "value": v} for k, v in plain.items()]
    env.append({"name": "PYTHONUNBUFFERED", "value": "1"})
    if job.spec.model.compile and role in MODEL_ROLES:  # a restarted pod finds its kernels compiled (runtime.py)
        env.append({"name": INDUCTOR_CACHE_VARIABLE, "value": f"{RUN_DIR}/{COMPILE_CACHE}"})
    secret = password_secret(job, settings)
    if secret:
        env.append({"name": REDIS_PASSWORD, "valueFrom": {"secretKeyRef": {"name": secret, "key": "password"}}})
    return env


def model_ranks(job: RLJob, role: str) -> tuple[int, int, str]:
    """(WORLD_SIZE, ranks per pod, OMNIRL_REPLICA_HOSTS) of a role's pods (docs/parallel.md, "On Kubernetes").

    The actor: replicas × parallel.ulysses ranks, `accelerator.count` of them per pod (rank 0 in pod 0 hosts the
    rendezvous, as before). A rollout replica of R = ulysses × tensor ranks: R, R / podsPerReplica per pod, and
    each replica's rendezvous: its first pod `<job>-rollout-<r·P>` through the headless Service
    `<job>-rollout-ranks` (a gang of P > 1 pods), or the pod itself (127.0.0.1, one pod per replica). Other
    roles: one rank."""
    roles = job.spec.roles
    if role == "actor":
        return actor_world(roles.actor.replicas, roles.actor.parallel), max(roles.actor.accelerator.count, 1), ""
    layout = roles.rollout.parallel
    if role != "rollout" or layout.ranks == 1:
        return 1, 1, ""
    pods = layout.podsPerReplica
    name = job.metadata.name
    hosts = [f"{child_name(name, 'rollout')}-{r * pods}.{child_name(name, suffix='rollout-ranks')}:{DIST_PORT}"
             if pods > 1 else f"127.0.0.1:{DIST_PORT}" for r in range(roles.rollout.replicas)]
    return layout.ranks, layout.ranks_per_pod, ",".join(hosts)


def role_ports(job: RLJob, role: str) -> list[dict[str, Any]]:
    """Container ports: metrics and gRPC health everywhere; weight-sync (and rendezvous) on the actor."""
    ports = [
        {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        {"name": "grpc-health", "containerPort": HEALTH_PORT, "protocol": "TCP"},
    ]
    if role == "actor":
        ports.append({"name": "weight-sync", "containerPort": WEIGHT_SYNC_PORT, "protocol": "TCP"})
        if model_ranks(job, "actor")[0] > 1:
            ports.append({"name": "dist", "containerPort": DIST_PORT, "protocol": "TCP"})
    elif role == "rollout" and job.spec.roles.rollout.parallel.podsPerReplica > 1:  # a gang's rendezvous
        ports.append({"name": "dist", "containerPort": DIST_PORT, "protocol": "TCP"})
    return ports


def startup_failures(job: RLJob) -> int:
    """The startup probe's failureThreshold: a role serves once it has loaded its model, which may
    take `failurePolicy.startup_limit_s` (its load beats for `startupDeadlineSeconds`, the
    `omnirl run` supervisor kills it `progressDeadlineSeconds` later); the kubelet allows as long."""
    return max(1, math.ceil(job.spec.failurePolicy.startup_limit_s / STARTUP_PERIOD_S))


def _grpc_probe(period_s: int, failures: int) -> dict[str, Any]:
    return {"grpc": {"port": HEALTH_PORT}, "periodSeconds": period_s, "failureThreshold": failures,
            "timeoutSeconds": 5}


def role_container(job: RLJob, role: str, settings: OperatorSettings) -> dict[str, Any]:
    """The role's one container (named after the role, so a user template can merge into it)."""
    spec = role_spec(job, role)
    container: dict[str, Any] = {
        "name": role,
        "image": settings.image_for(role),
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["omnirl", "role", role, "--job", JOB_FILE],
        "env": role_env(job, role, settings),
        "ports": role_ports(job, role),
        "resources": accelerator_resources(spec, settings),
        "volumeMounts": [
            {"name": "job-spec", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "run", "mountPath": RUN_DIR},
        ],
        # a failed container's last log lines become its termination message: the operator puts a
        # configuration error's one line (`omnirl role R: configuration error: ...`) in the RLJob status
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "startupProbe": _grpc_probe(STARTUP_PERIOD_S, startup_failures(job)),
        "livenessProbe": _grpc_probe(20, 3),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if role != "controller":  # readiness gates Service endpoints; a Job pod has none to gate
        container["readinessProbe"] = _grpc_probe(10, 3)
    if role in MODEL_ROLES:
        container["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})
    return container


def role_volumes(job: RLJob, role: str) -> list[dict[str, Any]]:
    """The job ConfigMap, the run directory (:func:`omnirl_operator.storage.run_volume`) and, for
    rollout and actor, a memory-backed /dev/shm for NCCL/HCCL and data loaders."""
    volumes: list[dict[str, Any]] = [
        {"name": "job-spec", "configMap": {"name": child_name(job.metadata.name, suffix="spec"),
                                           "items": [{"key": f, "path": f} for f in (JOB_KEY, MANIFEST_KEY)]}},
        run_volume(job, role),
    ]
    if role in MODEL_ROLES:
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
    return volumes


KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name"
KUEUE_GROUP_COUNT = "kueue.x-k8s.io/pod-group-total-count"


def gang_metadata(job: RLJob, role: str) -> dict[str, dict[str, str]]:
    """Pod labels and annotations that make a multi-pod rollout role one Kueue pod group: admitted whole or not at
    all (Kueue's plain-pod groups: `pod-group-name` label, `pod-group-total-count` annotation, the RLJob's
    `queue-name` label), so no replica's gang holds devices half-placed (docs/parallel.md). Empty for the other
    roles and for replicas of one pod (a pod is placed whole)."""
    layout = job.spec.roles.rollout.parallel
    if role != "rollout" or layout.podsPerReplica == 1:
        return {"labels": {}, "annotations": {}}
    labels = {KUEUE_GROUP: child_name(job.metadata.name, "rollout")}
    queue = ((job.metadata.model_extra or {}).get("labels") or {}).get(KUEUE_QUEUE)
    if queue:
        labels[KUEUE_QUEUE] = queue
    total = job.spec.roles.rollout.replicas * layout.podsPerReplica
    return {"labels": labels, "annotations": {KUEUE_GROUP_COUNT: str(total)}}


def pod_template(
    job: RLJob,
    role: str,
    settings: OperatorSettings,
    spec_hash: str,
    *,
    restart_policy: str = "Always",
    service_account: str | None = None,
) -> dict[str, Any]:
    """The PodTemplateSpec of ``role``, with ``roles.<role>.template`` merged over it.

    Args:
        spec_hash: hash of the job's ConfigMap content; a changed spec changes the template
            annotation and so rolls the pods.
        restart_policy: ``Always`` for Deployments/StatefulSets, ``Never``/``OnFailure`` for the Job.
        service_account: only the controller gets one (and an API token); the others mount none.

    Raises:
        ValueError: from :func:`redis_url` when no Redis is known.
    """
    name = job.metadata.name
    spec: dict[str, Any] = {
        "restartPolicy": restart_policy,
        "automountServiceAccountToken": service_account is not None,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": job.spec.failurePolicy.terminationGracePeriodSeconds,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [role_container(job, role, settings)],
        "volumes": role_volumes(job, role),
        **accelerator_scheduling(role_spec(job, role)),
        **pod_affinity(job, role),
    }
    if service_account is not None:
        spec["serviceAccountName"] = service_account
    spec.update(pull_secrets(settings))
    template: dict[str, Any] = {
        "metadata": {"labels": child_labels(name, role), "annotations": {ANNOTATION_SPEC_HASH: spec_hash}},
        "spec": spec,
    }
    gang = gang_metadata(job, role)
    template["metadata"]["labels"].update(gang["labels"])
    template["metadata"]["annotations"].update(gang["annotations"])
    user = role_spec(job, role).template
    if user:
        template = deep_merge(template, user)
        # the selector's labels, and those the reconcile lists the job's pods by, stay ours
        template["metadata"].setdefault("labels", {}).update({**pod_labels(name), **selector_labels(name, role)})
    return template
