"""Shape checks of a user pod template (`roles.<role>.template`, `reward[].server.template`).

The operator merges the template over the pod it builds (containers by `name`). The API server
refuses a container without an image and ignores a field outside `metadata`/`spec` of a
PodTemplateSpec, so a misspelt container name or a forgotten `spec:` level would pass
`omnirl validate` and then never start the role, or silently drop a node selector.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omnirl.api.errors import FieldProblem, FieldProblems
from omnirl.api.runtime import REDIS_PASSWORD, SERVED_PORTS, USER_SETTABLE, VARIABLES

POD_TEMPLATE_FIELDS = ("metadata", "spec")
OPERATOR_PORTS_FIELDS = ("health_port", "metrics_port")
# the role-process variables whose value the operator also renders elsewhere in the pod and its
# Services (they hold `runtime.SERVED_PORTS`): a template's env entry would move the server alone
OPERATOR_PORTS = {
    VARIABLES[OPERATOR_PORTS_FIELDS[0]]: "the role's gRPC health, which the pod's startupProbe, livenessProbe and readinessProbe "
                              "and its containerPort grpc-health point at: on another port every probe fails and "
                              "the kubelet restarts the container until the job fails",
    VARIABLES[OPERATOR_PORTS_FIELDS[1]]: "the controller's /metrics, which the pod's containerPort metrics and the job's "
                               "headless Service <job>-metrics (the chart's ServiceMonitor) point at: on another port "
                               "Prometheus scrapes nothing",
}
_RANKS = "the actor ranks' rendezvous (StatefulSet pod index, <job>-actor-0.<job>-ranks:29400); set roles.actor.replicas"
# why each other variable the operator writes for a role container (`pods.py::role_env`) is its own,
# and the field that changes it: a template's entry replaced the operator's value alone (measured:
# `omnirl render` gave the rollout OMNIRL_WEIGHT_SYNC_ADDR=10.0.0.9:29500 instead of <job>-actor:29500)
_OWNED_WHY = {
    "job_name": "the job's Redis keys omnirl:<job>:...; it is metadata.name",
    "redis_url": "the job's TransferQueue; set spec.transferQueue.redisUrl",
    "weight_sync_addr": "the actor's Service <job>-actor:29500, where rollout workers fetch weights; nothing to set",
    "worker_id": "the pod's name (downward API), unique per replica: its Redis consumer and weight-sync member id",
    "out_dir": "the run volume /var/lib/omnirl the pod mounts (checkpoints, ledger, metrics); set spec.storage",
    "export": "on only when the controller shares the run volume with the actor; set spec.storage",
    "report_status": "the controller patches the RLJob's status; nothing to set",
    "namespace": "the pod's namespace (downward API); set metadata.namespace",
    "rank": _RANKS, "world_size": _RANKS, "master_addr": _RANKS, "master_port": _RANKS,
    "manifest": "the job's manifest as written (judges as reward[].server) in the job's ConfigMap, which the "
                "controller writes into exports; nothing to set",
    "resume": "auto: a restarted pod continues from the job's latest complete checkpoint (0 would start it over "
              "and overwrite the run); to start over, create a new RLJob",
    "ranks_per_pod": "the ranks a pod of a model role holds, one per device: its accelerator.count; set "
                     "roles.<role>.parallel",
    "replica_hosts": "each rollout replica's rendezvous, its first pod (<job>-rollout-N.<job>-rollout-ranks:29400); "
                     "set roles.rollout.parallel",
}
OPERATOR_OWNED = {
    **{VARIABLES[f]: why for f, why in _OWNED_WHY.items()},
    REDIS_PASSWORD: "read from the job's Secret (spec.transferQueue.passwordSecret, else <job>-redis)",
}
# one owner: every RoleEnv variable is either user-settable or has its reason above
if set(VARIABLES) != {*_OWNED_WHY, *OPERATOR_PORTS_FIELDS, *USER_SETTABLE}:
    raise RuntimeError(f"decide who owns {sorted(set(VARIABLES) - {*_OWNED_WHY, *OPERATOR_PORTS_FIELDS, *USER_SETTABLE})}"
                       " in api/podtemplate.py::_OWNED_WHY or api/runtime.py::USER_SETTABLE")


def check_pod_template(template: dict[str, Any], container: str, path: str, *, role: bool = False) -> None:
    """Refuse a pod template the operator's merge would turn into a pod that cannot run as meant.

    Args:
        template: the user's PodTemplateSpec (a mapping; `metadata` and `spec`).
        container: name of the generated container the template merges into (`rollout`, `judge` ...).
        path: field path of `template`, relative to the model whose validator calls this
            (e.g. `rollout.template`), used in the error.
        role: `container` runs a role process (`roles.<role>.template`): its env may not set the
            ports the operator renders into probes and Services (`OPERATOR_PORTS`) nor any other
            variable the operator sets (`OPERATOR_OWNED`; `runtime.USER_SETTABLE` ones it may).

    Raises:
        FieldProblem: a key other than `metadata`/`spec` at the top (fix: move it under `spec`);
            `spec`/`metadata` not a mapping; `spec.containers` not a list of mappings with a `name`;
            a container whose name is not `container` and that has no `image` (a misspelt name
            would add an image-less sidecar the API server refuses); with `role`, an `env` of
            `container` that is not a list or that sets a variable of `OPERATOR_PORTS` or `OPERATOR_OWNED`
            (`FieldProblems` naming every such entry when there are several).
    """
    for key, value in template.items():
        if key not in POD_TEMPLATE_FIELDS:
            raise FieldProblem(f"{path}.{key}", value, "a pod template holds only metadata and spec (Kubernetes "
                               f"ignores anything else); move it under spec: template: {{spec: {{{key}: ...}}}}")
        if not isinstance(value, dict):
            raise FieldProblem(f"{path}.{key}", value, "must be a mapping")
    containers = template.get("spec", {}).get("containers")
    if containers is None:
        return
    if not isinstance(containers, list):
        raise FieldProblem(f"{path}.spec.containers", containers, f"must be a list, e.g. [{{name: {container}, "
                           "resources: {...}}]")
    for i, item in enumerate(containers):
        where = f"{path}.spec.containers[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise FieldProblem(where, item, f"must be a mapping with a name: {container} to change the generated "
                               "container, another name (and an image) for a sidecar")
        if item["name"] != container and not item.get("image"):
            raise FieldProblem(f"{where}.name", item["name"], f"is not the generated container ({container}) and "
                               f"has no image, so the pod would be refused; name it {container} to merge into that "
                               "container, or give the sidecar an image")
        if role and item["name"] == container:
            _check_role_env(item.get("env"), f"{where}.env")


def _check_role_env(env: Any, path: str) -> None:
    """Refuse an env entry of the role container that sets a variable the operator owns
    (`OPERATOR_PORTS`, `OPERATOR_OWNED`: all but `runtime.USER_SETTABLE`): the operator merged it
    over its own (user items win), so e.g. the role served elsewhere than its probes and Services
    looked (measured: health on 9000, every probe on 8081)."""
    FieldProblems.raise_any(role_env_problems(env, path))


def role_env_problems(env: Any, path: str) -> list[FieldProblem]:
    """Every refused entry of a role container's `env` (see `check_pod_template`), each with its
    own path `{path}[j]`: a user fixing the manifest fixes them all at once (only the first was
    reported). Empty when none is refused; one problem for an `env` that is not a list."""
    if env is None:
        return []
    if not isinstance(env, list):
        return [FieldProblem(path, env, "must be a list of {name, value} entries")]
    found = []
    for j, item in enumerate(env):
        name = item.get("name") if isinstance(item, dict) else None
        if name in OPERATOR_OWNED:
            found.append(FieldProblem(f"{path}[{j}]", item, f"{name} is set by the operator: "
                                      f"{OPERATOR_OWNED[name]}; remove this entry"))
        if name in OPERATOR_PORTS:
            field = next(f for f, var in VARIABLES.items() if var == name)
            found.append(FieldProblem(
                f"{path}[{j}]", item, f"{name} is set by the operator to {SERVED_PORTS[field]}, the port of "
                f"{OPERATOR_PORTS[name]}; remove this entry (a pod has its own network, so {SERVED_PORTS[field]} "
                "can clash only with a sidecar of the same pod: move the sidecar's port)"))
    return found


ENV_FROM_KINDS = {"configMapRef": "ConfigMap", "secretRef": "Secret"}


def role_env_from_problems(template: dict[str, Any], container: str, path: str,
                           keys_of: Callable[[str, str], list[str] | None]) -> list[FieldProblem]:
    """Every `envFrom` source of a role container (`roles.<role>.template`) that would set a variable the
    operator owns (`OPERATOR_OWNED`, `OPERATOR_PORTS`: what `role_env_problems` refuses as an `env` entry).

    Kubernetes gives a container's `env` precedence over its `envFrom`, so such a key cannot override a
    variable the operator writes; it sets one the operator leaves unset in that role (the actor ranks'
    rendezvous with one rank, `OMNIRL_REPORT_STATUS` outside the controller, `REDIS_PASSWORD` without a
    Secret), as silently. A ConfigMap or Secret is read where it lives (its keys only), so `omnirl validate`
    cannot check this; the operator does, before it applies the job's children.

    Args:
        template: the role's template (shape already checked by `check_pod_template`).
        container: the role container's name (the role).
        path: field path of `template` for the problem lines (`spec.roles.rollout.template`).
        keys_of: `(kind, name) -> keys` of a ConfigMap or Secret in the job's namespace; None when it cannot
            be read (absent: the kubelet reports it; no permission), which is not a problem here.
    Returns:
        One problem per source, naming its keys and the variables they set; empty when none.
    """
    containers = (template.get("spec") or {}).get("containers") or []
    found = []
    for i, item in enumerate(containers):
        if not isinstance(item, dict) or item.get("name") != container or not isinstance(item.get("envFrom"), list):
            continue
        for k, source in enumerate(item["envFrom"]):
            if not isinstance(source, dict):
                continue
            ref = next(((kind, source[f]) for f, kind in ENV_FROM_KINDS.items() if isinstance(source.get(f), dict)), None)
            name = ref[1].get("name") if ref else None
            if not isinstance(name, str) or not name:
                continue
            keys = keys_of(ref[0], name)
            prefix = source.get("prefix") or ""
            owned = sorted(f"{prefix}{key}" for key in keys or () if f"{prefix}{key}" in {*OPERATOR_OWNED, *OPERATOR_PORTS})
            if owned:
                found.append(FieldProblem(
                    f"{path}.spec.containers[{i}].envFrom[{k}]", source,
                    f"{ref[0]} {name!r} sets {', '.join(owned)}, which the operator owns ("
                    f"{OPERATOR_OWNED.get(owned[0]) or OPERATOR_PORTS[owned[0]]}), refused as an env entry of this "
                    "template is; remove "
                    f"{'that key' if len(owned) == 1 else 'those keys'} from the {ref[0]}, or give this envFrom "
                    "another prefix"))
    return found
