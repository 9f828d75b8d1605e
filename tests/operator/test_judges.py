"""Judge servers an RLJob deploys itself (`reward[].server`): spec checks, the Deployment and
Service the operator builds (checked with `kubernetes-validate --strict`), the wired URL, render."""

from __future__ import annotations

import argparse
import io

import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError

from omnirl.api.loader import job_from_dict
from omnirl.api.problems import problem_lines
from omnirl.api.spec import RLJob
from omnirl.scorers.judges import argv, wire
from omnirl_operator import render
from omnirl_operator.builders import build_children
from omnirl_operator.judges import judge_roles, judges_ready
from omnirl_operator.meta import adopt
from omnirl_operator.settings import OperatorSettings

SETTINGS = OperatorSettings(default_redis_url="redis://redis:6379/0")
K8S_VERSIONS = ("1.31", kubernetes_validate.utils.latest_version())
UID = "4f9d7a52-7f53-4f5a-9d9e-000000000001"
VLLM = {"image": "vllm/vllm-openai:v0.11.0", "command": ["vllm", "serve", "{modelPath}"],
        "args": ["--port", "{port}", "--max-model-len", "4096"], "volume": {"persistentVolumeClaim": {"claimName": "qwen"}},
        "accelerator": {"type": "nvidia", "count": 1}, "port": 8001, "urlPath": "/v1", "healthPath": "/health"}


def job(rewards: list[dict], name: str = "demo"):
    return job_from_dict({"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob",
                          "metadata": {"name": name, "namespace": "team"},
                          "spec": {"data": {"trainPrompts": "/p.txt"}, "reward": rewards}})


def kids(j, **kw) -> dict[str, dict]:
    return {f"{c['kind']}/{c['metadata']['name']}": c
            for c in adopt(build_children(j, SETTINGS, **kw), j.metadata.name, "team", UID)}


def test_judge_children_validate_and_the_pods_read_the_service_url():
    j = job([{"name": "ocr", "kind": "ocr"},
             {"name": "vlm_judge", "kind": "http", "weight": 0.5, "server": VLLM},
             {"name": "small", "kind": "http", "server": {"command": ["python", "-m", "x", "--port", "{port}"],
                                                         "modelPath": "/mnt/models/small", "urlPath": "/score"}}])
    built = kids(j)
    for doc in built.values():
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
    deploy, svc = built["Deployment/demo-judge-vlm-judge"], built["Service/demo-judge-vlm-judge"]
    assert deploy["metadata"]["ownerReferences"][0]["uid"] == UID and svc["metadata"]["ownerReferences"][0]["uid"] == UID
    c = deploy["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "vllm/vllm-openai:v0.11.0"
    assert c["command"] == ["vllm", "serve", "/models", "--port", "$(OMNIRL_JUDGE_PORT)", "--max-model-len", "4096"]
    assert {"name": "OMNIRL_JUDGE_PORT", "value": "8001"} in c["env"]  # the kubelet expands $(VAR) from env
    assert c["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["volumeMounts"] == [{"name": "model", "mountPath": "/models", "readOnly": True}]
    assert deploy["spec"]["template"]["spec"]["volumes"] == [{"name": "model", "persistentVolumeClaim": {"claimName": "qwen"}}]
    # the Service selects exactly the judge's pods, and not through the job label the metrics Service uses
    pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert "omnirl.dev/job" not in pod_labels
    small = built["Deployment/demo-judge-small"]["spec"]["template"]["spec"]
    assert small["containers"][0]["image"] == SETTINGS.image_for("reward")
    assert small["containers"][0]["readinessProbe"]["tcpSocket"] == {"port": "http"}
    assert small["volumes"] == [{"name": "model", "hostPath": {"path": "/mnt/models/small", "type": "Directory"}}]
    # the startup probe allows server.startupSeconds (default 900 s: 90 periods of 10 s), as `omnirl run` waits
    assert (c["startupProbe"]["periodSeconds"], c["startupProbe"]["failureThreshold"]) == (10, 90)
    longer = job([{"name": "vlm_judge", "kind": "http", "server": {**VLLM, "startupSeconds": 1801}}])
    probe = kids(longer)["Deployment/demo-judge-vlm-judge"]["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    assert (probe["periodSeconds"], probe["failureThreshold"]) == (10, 181)  # rounded up: never less than asked
    # the ConfigMap's manifest: URL wired in, no server left (the pods never see one)
    spec = yaml.safe_load(built["ConfigMap/demo-spec"]["data"]["job.yaml"])["spec"]
    assert [(r["name"], r["url"], r["server"]) for r in spec["reward"]] == [
        ("ocr", None, None), ("vlm_judge", "http://demo-judge-vlm-judge:8001/v1", None),
        ("small", "http://demo-judge-small:8000/score", None)]
    # suspended or finished: the judges free their accelerators too
    assert kids(j, running=False)["Deployment/demo-judge-vlm-judge"]["spec"]["replicas"] == 0


def test_the_controller_pod_reads_the_manifest_as_written_for_its_exports(tmp_path):
    """The ConfigMap also holds the manifest as written (`manifest.yaml`: judges as `server`), mounted
    beside job.yaml and named by OMNIRL_MANIFEST; the controller's check accepts the pair and its
    exports carry it. Before, an export's job.yaml held `http://demo-judge-small:8000/score`, a Service
    gone with the RLJob (`omnirl export RUN` of a Kubernetes run reads exports/latest/job.yaml)."""
    from omnirl.api.loader import load_rljob
    from omnirl.api.runtime import RoleEnv
    from omnirl.controller.loop import written_manifest

    small = {"command": ["python", "-m", "x", "--port", "{port}"], "urlPath": "/score"}
    j = job([{"name": "ocr", "kind": "ocr"}, {"name": "small", "kind": "http", "server": small}])
    built = kids(j)
    data = built["ConfigMap/demo-spec"]["data"]
    assert sorted(data) == ["job.yaml", "manifest.yaml"]
    pod = built["Job/demo-controller"]["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "job-spec"]
    assert volume["configMap"]["items"] == [{"key": "job.yaml", "path": "job.yaml"},
                                            {"key": "manifest.yaml", "path": "manifest.yaml"}]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["OMNIRL_MANIFEST"] == "/etc/omnirl/manifest.yaml"
    for key in data:  # the pod's /etc/omnirl
        (tmp_path / key).write_text(data[key])
    wired = load_rljob(tmp_path / "job.yaml")
    assert wired.spec.reward[1].url == "http://demo-judge-small:8000/score" and wired.spec.reward[1].server is None
    contract = RoleEnv(job_name="demo", redis_url="redis://r/0", weight_sync_host="h", weight_sync_port=1,
                       worker_id="c", out_dir=str(tmp_path), manifest=str(tmp_path / "manifest.yaml"))
    written = written_manifest(wired, contract)
    assert written.spec.reward[1].url is None and written.spec.reward[1].server.command == small["command"]
    assert written == load_rljob(tmp_path / "manifest.yaml")


def test_a_judge_template_puts_it_on_a_node_pool_and_keeps_its_selector():
    template = {"metadata": {"labels": {"omnirl.dev/reward": "hijack", "team": "vision"}},
                "spec": {"nodeSelector": {"pool": "h100"}, "imagePullSecrets": [{"name": "regcred"}],
                         "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
                         "containers": [{"name": "judge", "env": [{"name": "HF_HOME", "value": "/cache"}]}]}}
    j = job([{"name": "judge", "kind": "http", "server": {**VLLM, "template": template}}])
    deploy = kids(j)["Deployment/demo-judge-judge"]
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(deploy, version, strict=True)
    pod = deploy["spec"]["template"]
    assert pod["metadata"]["labels"]["team"] == "vision"
    assert deploy["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()  # not hijacked
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"pool": "h100"} and spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert [t["key"] for t in spec["tolerations"]] == ["nvidia.com/gpu", "dedicated"]
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["HF_HOME"] == "/cache" and env["OMNIRL_JUDGE_PORT"] == "8001"  # merged, not replaced
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 1}


def test_judge_readiness_gates_the_controller():
    j = job([{"name": "j", "kind": "http", "server": {"command": ["srv"], "replicas": 2}}])
    assert judge_roles(j, {}, True) == {"judge-j": (2, 0)}
    assert not judges_ready(judge_roles(j, {}, True))
    stored = {"Deployment/demo-judge-j": {"status": {"readyReplicas": 1}}}
    assert judges_ready(judge_roles(j, stored, True))
    assert judges_ready({"rollout": (1, 0)})  # no judges: nothing to wait for


@pytest.mark.parametrize(("reward", "line"), [
    ({"name": "o", "kind": "ocr", "server": {"command": ["x"]}}, "reward[0].server"),
    ({"name": "h", "kind": "http", "url": "http://x", "server": {"command": ["x"]}}, "reward[0].url"),
    ({"name": "h", "kind": "http", "server": {"command": ["x"], "modelPath": "/m", "volume": {"emptyDir": {}}}},
     "reward[0].server.volume"),
    ({"name": "h", "kind": "http", "server": {"command": ["x"], "modelPath": "rel/dir"}}, "reward[0].server.modelPath"),
    ({"name": "h", "kind": "http", "server": {"command": ["x", "{modelPath}"]}}, "reward[0].server.command"),
    ({"name": "h", "kind": "http", "server": {"command": ["x"], "args": ["{modelPath}"]}}, "reward[0].server.args"),
    # a near miss of {port} or {modelPath} is passed on as written (`--port {prot}`: the judge exited 2)
    ({"name": "h", "kind": "http", "server": {"command": ["x", "--port", "{prot}"]}}, "reward[0].server.command"),
    ({"name": "h", "kind": "http", "server": {"command": ["x"], "args": ["--port={PORT}"]}}, "reward[0].server.args"),
    ({"name": "h", "kind": "http", "server": {"command": ["x", "{model_path}"], "modelPath": "/m"}},
     "reward[0].server.command"),
    ({"name": "h", "kind": "http", "server": {"command": []}}, "reward[0].server.command"),
    ({"name": "h", "kind": "http", "server": {"command": ["x"], "volume": {"emptyDir": {}, "hostPath": {}}}},
     "reward[0].server.volume"),
])
def test_impossible_server_settings_name_the_field(reward, line):
    with pytest.raises(ValidationError) as err:
        job([reward])
    lines = [text for _, text in problem_lines(RLJob, err.value)]
    assert len(lines) == 1 and lines[0].startswith(f"spec.{line}: "), lines


def test_name_clash_and_length_are_refused():
    with pytest.raises(ValidationError, match=r"reward\[1\].name"):
        job([{"name": "a_b", "kind": "http", "server": {"command": ["x"]}},
             {"name": "a-b", "kind": "http", "server": {"command": ["x"]}}])
    # refused by validation (`omnirl validate` said ok, the operator refused it), with the reason
    with pytest.raises(ValidationError) as err:
        job([{"name": "r" * 20, "kind": "http", "server": {"command": ["x"]}}], name="j" * 40)
    assert [text for _, text in problem_lines(RLJob, err.value)] == [
        f'spec.reward[0].name: "{"r" * 20}" is invalid: names the judge Service \'{"j" * 40}-judge-{"r" * 20}\' (67 '
        "characters), which must be a DNS-1035 label of at most 63 characters ending with a letter or digit: shorten "
        "or change the reward or job name"]
    with pytest.raises(ValidationError, match=r"spec.reward\[0\].name.*ending with a letter or digit"):
        job([{"name": "judge-", "kind": "http", "server": {"command": ["x"]}}])  # Service `demo-judge-judge-`
    job([{"name": "judge-", "kind": "http", "url": "http://x"}])  # no Service: the name is free


def test_a_misspelt_placeholder_is_named_with_the_one_meant():
    with pytest.raises(ValidationError) as err:
        job([{"name": "h", "kind": "http", "server": {"command": ["serve", "--port", "{prot}"]}}])
    assert [text for _, text in problem_lines(RLJob, err.value)] == [
        'spec.reward[0].server.command: "{prot}" is invalid: has the placeholder {prot}, which is not substituted (the '
        "server would get it as written); did you mean {port}? Only {port} and {modelPath} are"]
    # braces that are not a near miss stay as written: a shell's ${HOME}, JSON, {{x}}, awk's {print}
    server = {"command": ["sh", "-c", "serve --port {port} --home ${HOME} | awk '{print}'"], "args": ['{"a": 1}', "{{x}}"]}
    assert argv(job([{"name": "h", "kind": "http", "server": server}]).spec.reward[0].server, 9)[2] == (
        "serve --port 9 --home ${HOME} | awk '{print}'")


def test_substitution_and_wiring_are_plain():
    j = job([{"name": "h", "kind": "http", "server": {"command": ["s", "--port={port}", '{"a": 1}'],
                                                      "modelPath": "/m"}}])
    assert argv(j.spec.reward[0].server, 9) == ["s", "--port=9", '{"a": 1}']
    w = wire(j, {"h": "http://127.0.0.1:9/"})
    assert (w.spec.reward[0].url, w.spec.reward[0].server) == ("http://127.0.0.1:9/", None)
    assert j.spec.reward[0].server is not None  # the original is untouched


def test_render_shows_the_judge(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "r"},
                                    "spec": {"data": {"trainPrompts": "/p.txt"},
                                             "reward": [{"name": "vlm", "kind": "vlm", "server": VLLM,
                                                             "params": {"model": "qwen3-vl", "template": "rate"}}]}}))
    out, err = io.StringIO(), io.StringIO()
    assert render.main(argparse.Namespace(job=str(path), namespace="ns"), out, err) == 0, err.getvalue()
    names = {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(out.getvalue())}
    assert {("Deployment", "r-judge-vlm"), ("Service", "r-judge-vlm")} <= names
