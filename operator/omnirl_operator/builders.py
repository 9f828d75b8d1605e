"""RLJob → child manifests: pure functions from the typed spec to plain dicts (no Kubernetes client).

The children of job ``J`` (all labelled ``omnirl.dev/job: J``; :func:`omnirl_operator.meta.adopt`
adds the namespace and the controller ownerReference):

=============================  =================  ===============================================
name                           kind               what
=============================  =================  ===============================================
``J-controller``               ServiceAccount     identity of the controller pod
``J-controller``               Role, RoleBinding  get/patch ``rljobs/status`` of ``J`` only
``J-spec``                     ConfigMap          the validated job manifest: ``job.yaml`` (judges wired),
                                                  ``manifest.yaml`` (as written: what exports carry)
``J-actor``                    Service            weight-sync store on actor rank 0 (29500)
``J-ranks``                    Service (headless) stable DNS of actor ranks (``J-actor-N.J-ranks``)
``J-metrics``                  Service (headless) ``/metrics`` of every pod (ServiceMonitor target)
``J-rollout``, ``J-reward``    Deployment         stateless workers
``J-actor``                    StatefulSet        trainer ranks; rank = pod ordinal
``J-controller``               Job (batch/v1)     the single controller
``J-run``                      PVC                the run directory (``spec.storage`` with ``size``)
``J-redis``                    Secret             the default Redis's password (no ``passwordSecret``)
``J-judge-R``                  Deployment, Service  judge server of reward ``R`` (``reward[].server``)
=============================  =================  ===============================================

The actor is a StatefulSet, not a Deployment: torch.distributed needs one stable rank-0 address
(``MASTER_ADDR``) and ranks that survive restarts, which a Deployment's random pod names cannot
give; the ``J-actor`` Service selects only pod ``J-actor-0``, which hosts the weight-sync store.
"""

from __future__ import annotations

import hashlib
from typing import Any

import yaml

from omnirl.api.exits import PERMANENT_EXITS
from omnirl.api.loader import dump_rljob, resolve_paths
from omnirl.api.spec import API_GROUP, ROLE_NAMES, RLJob
from omnirl.api.spec_parallel import actor_world
from omnirl_operator.judges import build_judges, wired
from omnirl_operator.meta import (
    LABEL_METRICS,
    child_labels,
    child_name,
    object_meta,
    selector_labels,
)
from omnirl_operator.pods import (
    DIST_PORT,
    JOB_KEY,
    MANIFEST_KEY,
    METRICS_PORT,
    STARTUP_PERIOD_S,
    WEIGHT_SYNC_PORT,
    build_password_secret,
    pod_template,
    role_spec,
    startup_failures,
)
from omnirl_operator.settings import OperatorSettings
from omnirl_operator.storage import build_claim

WORKER_ROLES = ("rollout", "reward")
POD_START_SECONDS = 900  # scheduling a pod and pulling its image, before its startup probe counts


def progress_deadline_s(job: RLJob) -> int:
    """A worker Deployment's progressDeadlineSeconds: past it with no Ready pod the Deployment reports
    ProgressDeadlineExceeded, which the operator takes for a failed role (restarted per
    `failurePolicy`). A pod may be starting for its startup probe's whole budget
    (`failurePolicy.startup_limit_s`, `pods.startup_failures`) after it was scheduled and pulled
    (`POD_START_SECONDS`); a fixed 900 s restarted a load `startupDeadlineSeconds` allowed."""
    return POD_START_SECONDS + STARTUP_PERIOD_S * startup_failures(job)


def job_yaml(job: RLJob) -> str:
    """The validated manifest the pods read from ``/etc/omnirl/job.yaml`` (defaults filled in)."""
    spec = dump_rljob(job)["spec"]
    manifest = {
        "apiVersion": job.apiVersion,
        "kind": job.kind,
        "metadata": {"name": job.metadata.name, "namespace": job.metadata.namespace},
        "spec": spec,
    }
    if manifest["metadata"]["namespace"] is None:
        del manifest["metadata"]["namespace"]
    return yaml.safe_dump(manifest, sort_keys=False)


def spec_hash(text: str) -> str:
    """First 16 hex digits of sha256(text): a pod-template annotation that rolls pods on change."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def template_digest(job: RLJob) -> str:
    """Hash of the job manifest without ``suspend``, role ``replicas`` and the claim's ``size`` and
    ``whenDeleted``: it annotates every pod template, so a spec change rolls the pods (and replaces
    the controller Job) while scaling, suspending or a claim setting the pods never see does not."""
    roles = job.spec.roles
    unscaled = roles.model_copy(update={r: getattr(roles, r).model_copy(update={"replicas": 1})
                                        for r in ROLE_NAMES})
    storage = job.spec.storage
    if storage is not None:
        storage = storage.model_copy(update={"size": None, "whenDeleted": "Retain"})
    spec = job.spec.model_copy(update={"roles": unscaled, "suspend": False, "storage": storage})
    return spec_hash(job_yaml(job.model_copy(update={"spec": spec})))


def build_configmap(job: RLJob, text: str, written: str) -> dict[str, Any]:
    """ConfigMap ``<job>-spec``: key ``job.yaml`` (``text``, the manifest the roles run, judges wired to
    their Services) and ``manifest.yaml`` (``written``, the same job with its judges as ``reward[].server``:
    the controller writes it into exports, ``OMNIRL_MANIFEST``)."""
    name = job.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(name, child_name(name, suffix="spec")),
        "data": {JOB_KEY: text, MANIFEST_KEY: written},
    }


def build_deployment(job: RLJob, role: str, settings: OperatorSettings, digest: str, *, running: bool = True
                     ) -> dict[str, Any]:
    """Deployment ``<job>-<role>`` of a stateless worker role (rollout or reward).

    ``running=False`` (suspended or finished) scales it to 0 replicas.
    """
    name = job.metadata.name
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(name, child_name(name, role), role),
        "spec": {
            "replicas": role_spec(job, role).replicas if running else 0,
            "selector": {"matchLabels": selector_labels(name, role)},
            "progressDeadlineSeconds": progress_deadline_s(job),
            "revisionHistoryLimit": 3,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": 0}},
            "template": pod_template(job, role, settings, digest),
        },
    }


def rollout_kind(job: RLJob) -> str:
    """The rollout's workload: a Deployment of replicas of one device, else a StatefulSet (pods of several ranks
    need their index, a gang its pods' stable names: docs/parallel.md, "On Kubernetes")."""
    return "Deployment" if job.spec.roles.rollout.parallel.ranks == 1 else "StatefulSet"


def workloads(job: RLJob) -> tuple[tuple[str, str, str], ...]:
    """(apiVersion, kind, role) of each role workload the reconcile writes and observes."""
    return (("apps/v1", rollout_kind(job), "rollout"), ("apps/v1", "Deployment", "reward"),
            ("apps/v1", "StatefulSet", "actor"))


def workload_pods(job: RLJob, role: str) -> int:
    """Pods of a role's workload: rollout replicas × podsPerReplica; the actor's ranks over accelerator.count per
    pod; the other roles' replicas."""
    roles = job.spec.roles
    if role == "rollout":
        return roles.rollout.replicas * roles.rollout.parallel.podsPerReplica
    if role == "actor":
        return actor_world(roles.actor.replicas, roles.actor.parallel) // max(roles.actor.accelerator.count, 1)
    return role_spec(job, role).replicas


def build_rollout_ranks(job: RLJob, settings: OperatorSettings, digest: str, *, running: bool = True
                        ) -> dict[str, Any]:
    """StatefulSet ``<job>-rollout`` of rollout replicas of several ranks: replica r is pods r·P … r·P + P − 1
    (P = podsPerReplica), each holding ranks_per_pod ranks (`omnirl.launch.pod_ranks`), meeting at pod r·P
    through the headless Service ``<job>-rollout-ranks``; all start together (Parallel)."""
    return _ranks_statefulset(job, "rollout", "rollout-ranks", settings, digest, running)


def build_actor(job: RLJob, settings: OperatorSettings, digest: str, *, running: bool = True) -> dict[str, Any]:
    """StatefulSet ``<job>-actor``: ranks start together (Parallel) and are replaced in place; a pod of several
    devices holds as many ranks."""
    return _ranks_statefulset(job, "actor", "ranks", settings, digest, running)


def _ranks_statefulset(job: RLJob, role: str, service: str, settings: OperatorSettings, digest: str,
                       running: bool) -> dict[str, Any]:
    """StatefulSet ``<job>-<role>`` of a model role's ranks: stable pod names through the headless Service
    ``<job>-<service>`` (where the ranks meet), all pods started together (Parallel) and replaced in place;
    zero replicas unless ``running``."""
    name = job.metadata.name
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": object_meta(name, child_name(name, role), role),
        "spec": {
            "replicas": workload_pods(job, role) if running else 0,
            "serviceName": child_name(name, suffix=service),
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector_labels(name, role)},
            "updateStrategy": {"type": "RollingUpdate"},
            "revisionHistoryLimit": 3,
            "template": pod_template(job, role, settings, digest),
        },
    }


def build_controller_job(job: RLJob, settings: OperatorSettings, digest: str) -> dict[str, Any]:
    """Job ``<job>-controller`` (batch/v1) running the single controller.

    Failure policy mapping (``spec.failurePolicy.controller``): ``restart-role`` lets the Job
    start a new pod up to ``backoffLimit: maxRestarts`` times; ``restart-job`` and ``fail-job`` make
    one failure final for the Job (``backoffLimit: 0``) and the operator then restarts the whole
    job or fails it. Either way a permanent exit code (``PERMANENT_EXITS``: the controller failed
    the job, or a configuration error) fails the Job at once (``podFailurePolicy`` FailJob, which
    needs ``restartPolicy: Never``); the operator then fails the RLJob.
    """
    name = job.metadata.name
    policy = job.spec.failurePolicy
    in_place = policy.controller == "restart-role"
    spec: dict[str, Any] = {
        "backoffLimit": policy.maxRestarts if in_place else 0,
        "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {
            "containerName": "controller", "operator": "In", "values": list(PERMANENT_EXITS)}}]},
        "completions": 1,
        "parallelism": 1,
        "template": pod_template(
            job, "controller", settings, digest,
            restart_policy="Never",
            service_account=child_name(name, "controller"),
        ),
    }
    if policy.activeDeadlineSeconds is not None:
        spec["activeDeadlineSeconds"] = policy.activeDeadlineSeconds
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": object_meta(name, child_name(name, "controller"), "controller"),
        "spec": spec,
    }


def build_services(job: RLJob) -> list[dict[str, Any]]:
    """The actor's weight-sync Service, the ranks' headless Service, and the metrics Service."""
    name = job.metadata.name
    actor = child_name(name, "actor")
    rank0 = {**selector_labels(name, "actor"), "statefulset.kubernetes.io/pod-name": f"{actor}-0"}
    ranks_ports = [{"name": "weight-sync", "port": WEIGHT_SYNC_PORT, "targetPort": WEIGHT_SYNC_PORT,
                    "protocol": "TCP"}]
    if actor_world(job.spec.roles.actor.replicas, job.spec.roles.actor.parallel) > 1:
        ranks_ports.append({"name": "dist", "port": DIST_PORT, "targetPort": DIST_PORT, "protocol": "TCP"})
    metrics_meta = object_meta(name, child_name(name, suffix="metrics"))
    metrics_meta["labels"][LABEL_METRICS] = "true"
    gang = []
    if job.spec.roles.rollout.parallel.podsPerReplica > 1:  # a rollout replica's pods resolve each other by name
        gang.append({
            "apiVersion": "v1", "kind": "Service",
            "metadata": object_meta(name, child_name(name, suffix="rollout-ranks"), "rollout"),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": selector_labels(name, "rollout"),
                     "ports": [{"name": "dist", "port": DIST_PORT, "targetPort": DIST_PORT, "protocol": "TCP"}]},
        })
    return gang + [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": object_meta(name, actor, "actor"),
            "spec": {
                "type": "ClusterIP",
                # Rank 0 connects to its own weight-sync store through this Service while it starts
                # (torch's TCPStore master dials the host it is given), before its readiness probe
                # passes: without this the Service has no endpoint yet and the actor never starts.
                "publishNotReadyAddresses": True,
                "selector": rank0,
                "ports": [{"name": "weight-sync", "port": WEIGHT_SYNC_PORT, "targetPort": WEIGHT_SYNC_PORT,
                           "protocol": "TCP"}],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": object_meta(name, child_name(name, suffix="ranks"), "actor"),
            "spec": {
                "clusterIP": "None",
                # Ranks must resolve each other before they are Ready (rendezvous comes first).
                "publishNotReadyAddresses": True,
                "selector": selector_labels(name, "actor"),
                "ports": ranks_ports,
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metrics_meta,
            "spec": {
                "clusterIP": "None",
                "selector": selector_labels(name),
                "ports": [{"name": "metrics", "port": METRICS_PORT, "targetPort": METRICS_PORT, "protocol": "TCP"}],
            },
        },
    ]


def build_controller_rbac(job: RLJob) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding letting the controller pod read and patch the status
    of its own RLJob only (``resourceNames: [<job>]``) and nothing else."""
    name = job.metadata.name
    sa = child_name(name, "controller")
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": object_meta(name, sa, "controller"),
         "automountServiceAccountToken": False},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": object_meta(name, sa, "controller"),
            "rules": [{"apiGroups": [API_GROUP], "resources": ["rljobs/status"], "resourceNames": [name],
                       "verbs": ["get", "patch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": object_meta(name, sa, "controller"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
            "subjects": [{"kind": "ServiceAccount", "name": sa}],
        },
    ]


def build_children(job: RLJob, settings: OperatorSettings, *, running: bool | None = None) -> list[dict[str, Any]]:
    """Every child of ``job``, in creation order (identities and config before workloads).

    Args:
        running: whether pods should run; default ``not spec.suspend``. When false, the workloads
            have 0 replicas and the controller Job is left out (the reconcile deletes it).

    Relative ``spec.data`` and ``spec.model.path`` values are made absolute against
    ``settings.data_root`` (a directory in the pods) in the ConfigMap the pods read.

    Raises:
        ValueError: naming ``spec.transferQueue.redisUrl`` when no Redis URL is known.
    """
    job = resolve_paths(job, settings.data_root)  # relative prompt/model paths, as seen in the pods
    running = (not job.spec.suspend) if running is None else running
    judges = build_judges(job, settings, running=running)
    written = job_yaml(job)  # judges as `server`: what exports carry (an export outlives the judge's Service)
    job = wired(job)  # the pods read judge rewards with their Service URL (omnirl_operator.judges)
    text = job_yaml(job)
    digest = template_digest(job)
    children = [*build_controller_rbac(job), build_configmap(job, text, written), *build_services(job), *judges]
    secret = build_password_secret(job, settings)
    if secret is not None:
        children.append(secret)
    claim = build_claim(job)  # kept when suspended or finished: it holds the results
    if claim is not None:
        children.append(claim)
    children += [build_rollout_ranks(job, settings, digest, running=running)
                 if role == "rollout" and rollout_kind(job) == "StatefulSet"
                 else build_deployment(job, role, settings, digest, running=running) for role in WORKER_ROLES]
    children.append(build_actor(job, settings, digest, running=running))
    if running:
        children.append(build_controller_job(job, settings, digest))
    return children


def desired_replicas(job: RLJob, *, running: bool) -> dict[str, int]:
    """Pods per role the children ask for (what ``status.roles[*].desired`` reports)."""
    if not running:
        return {role: 0 for role in ROLE_NAMES}
    return {role: workload_pods(job, role) for role in ROLE_NAMES}


def label_of(child: dict[str, Any]) -> str:
    """``Kind/name`` of a manifest, for logs and events."""
    return f"{child.get('kind')}/{child.get('metadata', {}).get('name')}"


__all__ = [
    "build_actor",
    "build_rollout_ranks",
    "rollout_kind",
    "workload_pods",
    "workloads",
    "build_children",
    "build_configmap",
    "build_controller_job",
    "build_controller_rbac",
    "build_deployment",
    "build_services",
    "child_labels",
    "desired_replicas",
    "job_yaml",
    "label_of",
    "spec_hash",
    "template_digest",
]
