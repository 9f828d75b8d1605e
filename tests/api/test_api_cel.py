"""The CRD's CEL rules (`x-kubernetes-validations`, from each spec model's `cel_rules`) against the pydantic
validators that own those checks: on the same manifests both accept or both refuse, at the same field.

Before, the CRD had no cross-field rule: `kubectl apply` took e.g. `lora: {rank: 8}` without
`enabled: true`, which the operator then marked InvalidSpec. The API server's CEL (cel-go) is not here:
the rules are evaluated with `common-expression-language` (cel-rust) the way Kubernetes feeds them:
`self` is the rule's node, a null is an absent field, a `number` field is a double.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import cel
import pytest
import yaml
from pydantic import ValidationError

from omnirl.api.crd import build_crd
from omnirl.api.loader import dump_rljob, job_from_dict, load_rljob
from omnirl.api.problems import problem_lines
from omnirl.api.spec import RLJob

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
SCHEMA = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
BASE = {"data": {"trainPrompts": "t.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}]}
SD3 = {"family": "sd3", "path": "/models/sd3", "dtype": "bfloat16"}
NVIDIA = {"accelerator": {"type": "nvidia", "count": 1, "product": "h200"}}
JUDGE = {"command": ["serve", "--port", "{port}"]}


def _cel_value(value: Any, node: dict[str, Any]) -> Any:
    """`value` as Kubernetes hands it to CEL: null fields left out, `number` fields as doubles."""
    if isinstance(value, dict):
        props, extra = node.get("properties") or {}, node.get("additionalProperties")
        return {k: _cel_value(v, props.get(k, extra if isinstance(extra, dict) else {}))
                for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_cel_value(v, node.get("items") or {}) for v in value]
    if node.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def cel_refusals(value: Any, node: dict[str, Any] = SCHEMA, path: str = "") -> list[tuple[str, str]]:
    """`(field path, message)` of every rule of the CRD that `value` breaks (the whole object)."""
    if value is None:
        return []
    out = []
    for rule in node.get("x-kubernetes-validations", []):
        if cel.evaluate(rule["rule"], {"self": _cel_value(value, node)}) is not True:
            out.append((path + rule.get("fieldPath", ""), rule["message"]))
    if isinstance(value, dict):
        for key, sub in value.items():
            if key in (node.get("properties") or {}):
                out += cel_refusals(sub, node["properties"][key], f"{path}.{key}".lstrip("."))
    if isinstance(value, list) and isinstance(node.get("items"), dict):
        for i, item in enumerate(value):
            out += cel_refusals(item, node["items"], f"{path}[{i}]")
    return out


def pydantic_refusal(doc: dict[str, Any]) -> str | None:
    """The field of the first problem `omnirl validate` (and the operator) names, or None when valid."""
    try:
        job_from_dict(doc)
    except ValidationError as exc:
        return problem_lines(RLJob, exc)[0][1].split(": ", 1)[0]
    return None


def rules() -> list[tuple[str, dict[str, Any]]]:
    """Every `(node path, rule)` of the CRD."""
    out = []

    def walk(node: dict[str, Any], path: str) -> None:
        out.extend((path, r) for r in node.get("x-kubernetes-validations", []))
        for key, sub in (node.get("properties") or {}).items():
            walk(sub, f"{path}.{key}".lstrip("."))
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    walk(SCHEMA, "")
    return out


def manifest(**spec: Any) -> dict[str, Any]:
    body = copy.deepcopy(BASE)
    body.update(copy.deepcopy(spec))
    return {"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "cel"}, "spec": body}


ACCEPTED = {
    "base": manifest(),
    "lora on": manifest(model={"lora": {"enabled": True, "rank": 8, "alpha": 16.0, "targetModules": ["qkv"]}}),
    "lora off, defaults written": manifest(model={"lora": {"enabled": False, "rank": 32, "alpha": 64, "targetModules": []}}),
    "judges": manifest(reward=[{"name": "ocr", "kind": "ocr"}, {"name": "h", "kind": "http", "url": "http://s:8000/score"},
                               {"name": "v", "kind": "http",
                                "server": {**JUDGE, "healthPath": "/health", "urlPath": "/v1/score"}},
                               {"name": "g", "kind": "grpc", "server": {**JUDGE, "healthPath": None, "modelPath": "/m"}}]),
    "autoscale": manifest(roles={"reward": {"replicas": 2, "autoscale": {"minReplicas": 2, "maxReplicas": 4}}}),
    "cudnn": manifest(model={**SD3, "attention": "cudnn", "resolution": [512, 384]},
                      roles={"rollout": {**NVIDIA, "batching": "packed"}, "actor": NVIDIA}),
    "nft": manifest(algorithm={"name": "diffusion-nft", "nft": {"sigmaRange": [0.1, 0.9]}}),
    "awm grid": manifest(algorithm={"name": "awm", "sampling": {"numSteps": 10}, "awm": {"timestepFraction": 0.2}}),
    "queue": manifest(transferQueue={"tensorTtlSeconds": 120, "claimIdleSeconds": 60, "maxStreamLength": 192}),
    "ranks": manifest(roles={"actor": {"replicas": 2}}, storage={"size": "1Gi", "accessModes": ["ReadWriteMany"]}),
    "ranks on one node": manifest(roles={"actor": {"replicas": 2}}, storage={"size": "1Gi", "singleNode": True}),
    "validation": manifest(data={"trainPrompts": "t.txt", "validationPrompts": "v.txt"},
                           reward=[{"name": "ocr", "kind": "ocr"}, {"name": "pc", "kind": "pairwise-contrast"}]),
    "ulysses rollout, gang of pods, hsdp actor": manifest(
        model={**SD3, "family": "flux"}, storage={"size": "1Gi", "accessModes": ["ReadWriteMany"]},
        roles={"rollout": {"accelerator": {"type": "nvidia", "count": 2},
                           "parallel": {"ulysses": 4, "encoderTensor": 2, "podsPerReplica": 2}},
               "actor": {"replicas": 4, "accelerator": {"type": "nvidia", "count": 4},
                         "parallel": {"ulysses": 2, "replicate": 2}}}),
    "dit tensor parallel": manifest(model={**SD3, "family": "qwen-image"},
                                    roles={"rollout": {"accelerator": {"type": "nvidia", "count": 2},
                                                       "parallel": {"tensor": 2}}}),
    "nulls": manifest(model={"resolution": None, "resolutions": None}, storage=None,
                      reward=[{"name": "ocr", "kind": "ocr", "url": None, "server": None}]),
}

# (case, spec, the field pydantic names first)
SMOOTH = [{"name": "smooth", "kind": "temporal-consistency"}]  # a reward of video, for the video families
REFUSED = [
    ("lora rank", {"model": {"lora": {"rank": 8}}}, "spec.model.lora"),
    ("lora alpha", {"model": {"lora": {"alpha": 32}}}, "spec.model.lora"),
    ("lora modules", {"model": {"lora": {"enabled": False, "targetModules": ["q"]}}}, "spec.model.lora"),
    ("lora rank beside false", {"model": {"lora": {"enabled": False, "rank": 8}}}, "spec.model.lora"),
    ("float16", {"model": {"dtype": "float16"}}, "spec.model.dtype"),
    ("reserved name", {"reward": [{"name": "mean", "kind": "ocr"}]}, "spec.reward[0].name"),
    ("server on ocr", {"reward": [{"name": "o", "kind": "ocr", "server": JUDGE}]}, "spec.reward[0].server"),
    ("server and url", {"reward": [{"name": "h", "kind": "http", "url": "http://s:1/x", "server": JUDGE}]},
     "spec.reward[0].url"),
    ("grpc healthPath", {"reward": [{"name": "g", "kind": "grpc", "server": {**JUDGE, "healthPath": "/h"}}]},
     "spec.reward[0].server.healthPath"),
    ("grpc urlPath", {"reward": [{"name": "g", "kind": "grpc", "server": {**JUDGE, "urlPath": "/v1"}}]},
     "spec.reward[0].server.urlPath"),
    ("url on ocr", {"reward": [{"name": "o", "kind": "ocr", "url": "http://s:1/x"}]}, "spec.reward[0].url"),
    ("http without url", {"reward": [{"name": "h", "kind": "http"}]}, "spec.reward[0].url"),
    ("modelPath and volume", {"reward": [{"name": "v", "kind": "vlm", "server": {
        **JUDGE, "modelPath": "/m", "volume": {"persistentVolumeClaim": {"claimName": "m"}}}}]},
     "spec.reward[0].server.volume"),
    ("relative modelPath", {"reward": [{"name": "v", "kind": "vlm", "server": {**JUDGE, "modelPath": "m"}}]},
     "spec.reward[0].server.modelPath"),
    ("judge gpu count 0", {"reward": [{"name": "v", "kind": "vlm", "server": {
        **JUDGE, "accelerator": {"type": "nvidia"}}}]}, "spec.reward[0].server.accelerator.count"),
    ("cpu count 1", {"roles": {"rollout": {"accelerator": {"count": 1}}}}, "spec.roles.rollout.accelerator.count"),
    ("product of another type", {"roles": {"actor": {"accelerator": {"type": "nvidia", "count": 1,
                                                                     "product": "ascend-910b"}}}},
     "spec.roles.actor.accelerator.product"),
    ("autoscale max < min", {"roles": {"reward": {"replicas": 3, "autoscale": {"minReplicas": 3, "maxReplicas": 2}}}},
     "spec.roles.reward.autoscale.maxReplicas"),
    ("replicas outside autoscale", {"roles": {"reward": {"replicas": 5, "autoscale": {"maxReplicas": 4}}}},
     "spec.roles.reward.replicas"),
    ("two controllers", {"roles": {"controller": {"replicas": 2}}}, "spec.roles.controller.replicas"),
    *((f"two gpus, {role}", {"roles": {role: {"accelerator": {"type": "nvidia", "count": 2}}}},
       f"spec.roles.{role}.accelerator.count") for role in ("rollout", "reward", "actor", "controller")),
    ("rollout devices vs layout", {"model": {**SD3, "family": "flux"}, "roles": {"rollout": {
        "accelerator": {"type": "nvidia", "count": 1}, "parallel": {"ulysses": 2}}}}, "spec.roles.rollout.accelerator.count"),
    ("ulysses with tensor", {"model": {**SD3, "family": "flux"}, "roles": {"rollout": {
        "parallel": {"ulysses": 2, "tensor": 2}}}}, "spec.roles.rollout.parallel.tensor"),
    ("encoder tp does not divide", {"model": {**SD3, "family": "flux"}, "roles": {"rollout": {
        "parallel": {"ulysses": 2, "encoderTensor": 4}}}}, "spec.roles.rollout.parallel.encoderTensor"),
    ("pods do not divide", {"model": {**SD3, "family": "flux"}, "roles": {"rollout": {
        "parallel": {"ulysses": 2, "podsPerReplica": 3}}}}, "spec.roles.rollout.parallel.podsPerReplica"),
    ("actor tensor", {"roles": {"actor": {"parallel": {"tensor": 2}}}}, "spec.roles.actor.parallel.tensor"),
    ("actor encoder tp", {"roles": {"actor": {"parallel": {"encoderTensor": 2}}}},
     "spec.roles.actor.parallel.encoderTensor"),
    ("replicate does not divide", {"roles": {"actor": {"replicas": 3, "parallel": {"replicate": 2}}}},
     "spec.roles.actor.parallel.replicate"),
    ("ulysses without a plan, rollout", {"roles": {"rollout": {"parallel": {"ulysses": 2}}}},
     "spec.roles.rollout.parallel.ulysses"),
    ("ulysses without a plan, actor", {"model": SD3, "roles": {"actor": {"parallel": {"ulysses": 2}}}},
     "spec.roles.actor.parallel.ulysses"),
    ("dit tensor without a plan", {"model": SD3, "roles": {"rollout": {"parallel": {"tensor": 2}}}},
     "spec.roles.rollout.parallel.tensor"),
    ("dit tensor with lora", {"model": {**SD3, "family": "flux", "lora": {"enabled": True}},
                              "roles": {"rollout": {"parallel": {"tensor": 2}}}}, "spec.roles.rollout.parallel.tensor"),
    ("compile with ulysses", {"model": {**SD3, "family": "flux", "compile": True},
                              "roles": {"rollout": {"parallel": {"ulysses": 2}}}}, "spec.model.compile"),
    ("ulysses actor on ReadWriteOnce", {"model": {**SD3, "family": "flux"}, "storage": {"size": "1Gi"},
                                        "roles": {"actor": {"parallel": {"ulysses": 2}}}}, "spec.storage.accessModes"),
    ("ttl <= claim", {"transferQueue": {"tensorTtlSeconds": 100, "claimIdleSeconds": 100}},
     "spec.transferQueue.tensorTtlSeconds"),
    ("window lo = hi", {"algorithm": {"flowGrpo": {"window": {"range": [3, 3]}}}},
     "spec.algorithm.flowGrpo.window.range"),
    ("window too small", {"algorithm": {"flowGrpo": {"window": {"size": 4, "range": [0, 3]}}}},
     "spec.algorithm.flowGrpo.window.size"),
    ("band below 1", {"algorithm": {"flowGrpo": {"rolloutCorrection": {"rejectionSampling": {"band": [0.5, 0.9]}}}}},
     "spec.algorithm.flowGrpo.rolloutCorrection.rejectionSampling.band"),
    ("nft sigmas", {"algorithm": {"name": "diffusion-nft", "nft": {"sigmaRange": [0.5, 0.4]}}},
     "spec.algorithm.nft.sigmaRange"),
    ("awm sigmas", {"algorithm": {"name": "awm", "awm": {"sigmaRange": [0.5, 0.4]}}}, "spec.algorithm.awm.sigmaRange"),
    ("nft block, flow-grpo", {"algorithm": {"nft": {"beta": 1.0}}}, "spec.algorithm.nft"),
    ("flowGrpo block, awm", {"algorithm": {"name": "awm", "flowGrpo": {"klCoef": 0.0}}}, "spec.algorithm.flowGrpo"),
    ("awm block, dgpo", {"algorithm": {"name": "dgpo", "awm": {}}}, "spec.algorithm.awm"),
    ("dgpo block, awm", {"algorithm": {"name": "awm", "dgpo": {}}}, "spec.algorithm.dgpo"),
    ("updates do not divide", {"algorithm": {"optimizer": {"updatesPerStep": 3}}},
     "spec.algorithm.optimizer.updatesPerStep"),
    ("window past the grid", {"algorithm": {"sampling": {"numSteps": 10}, "flowGrpo": {"window": {"range": [0, 10]}}}},
     "spec.algorithm.flowGrpo.window.range"),
    ("awm grid too coarse", {"algorithm": {"name": "awm", "sampling": {"numSteps": 10}, "awm": {
        "timestepFraction": 0.15}}}, "spec.algorithm.awm.timestepFraction"),
    ("dgpo grid too coarse", {"algorithm": {"name": "dgpo", "sampling": {"numSteps": 4}, "dgpo": {
        "timestepFraction": 0.4}}}, "spec.algorithm.dgpo.timestepFraction"),
    ("reward names repeat", {"reward": [{"name": "ocr", "kind": "ocr"}, {"name": "ocr", "kind": "jpeg"}]},
     "spec.reward[1].name"),
    ("weights all 0", {"reward": [{"name": "ocr", "kind": "ocr", "weight": 0}]}, "spec.reward"),
    ("validation, group rewards only", {"data": {"trainPrompts": "t", "validationPrompts": "v"},
                                        "reward": [{"name": "pc", "kind": "pairwise-contrast"}]},
     "spec.data.validationPrompts"),
    ("ranks on ReadWriteOnce", {"roles": {"actor": {"replicas": 2}}, "storage": {"size": "1Gi"}},
     "spec.storage.accessModes"),
    ("resolution and resolutions", {"model": {**SD3, "resolution": [512, 512], "resolutions": [[512, 512]]}},
     "spec.model.resolutions"),
    ("ocr resolution", {"model": {"resolution": [32, 64]}}, "spec.model.resolution"),
    ("av-digits resolution", {"model": {"family": "av-digits", "resolution": [32, 64]},
                              "reward": [{"name": "sync", "kind": "avdigits-sync"}]}, "spec.model.resolution"),
    *((f"{f} resolution", {"model": {"family": f, "path": "/m", "resolution": [32, 64]}, "reward": SMOOTH},
       "spec.model.resolution") for f in ("wan", "ltx2", "minimax-h3")),
    ("minimax-h3 guidance", {"model": {"family": "minimax-h3", "path": "/m"}, "reward": SMOOTH,
                             "algorithm": {"sampling": {"guidanceScale": 2.0}}}, "spec.algorithm.sampling.guidanceScale"),
    ("ocr guidance", {"algorithm": {"sampling": {"guidanceScale": 2.0}}}, "spec.algorithm.sampling.guidanceScale"),
    ("sd3 builtin", {"model": {"family": "sd3"}}, "spec.model.path"),
    ("packed ocr", {"roles": {"rollout": {"batching": "packed"}}}, "spec.roles.rollout.batching"),
    ("cudnn flux", {"model": {**SD3, "family": "flux", "attention": "cudnn"}, "roles": {"rollout": NVIDIA, "actor": NVIDIA}},
     "spec.model.attention"),
    ("cudnn cpu", {"model": {**SD3, "attention": "cudnn"}}, "spec.model.attention"),
    ("cudnn float32", {"model": {**SD3, "dtype": "float32", "attention": "cudnn"},
                       "roles": {"rollout": NVIDIA, "actor": NVIDIA}}, "spec.model.attention"),
    ("short streams", {"transferQueue": {"maxStreamLength": 191}}, "spec.transferQueue.maxStreamLength"),
    ("resolution not /16", {"model": {**SD3, "resolution": [500, 512]}}, "spec.model.resolution"),
]


def related(a: str, b: str) -> bool:
    """One path is the other or lies under it (`spec.model.lora` and `spec.model.lora.rank`)."""
    return a == b or b.startswith(a + ".") or b.startswith(a + "[") or a.startswith(b + ".") or a.startswith(b + "[")


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_both_accept(name: str) -> None:
    doc = ACCEPTED[name]
    assert (pydantic_refusal(doc), cel_refusals(doc)) == (None, [])


def test_both_refuse_at_the_same_field_and_every_rule_is_exercised() -> None:
    hit, wrong = set(), []
    for name, spec, field in REFUSED:
        doc = manifest(**spec)
        refusals = cel_refusals(doc)
        hit |= {message for _, message in refusals}
        if pydantic_refusal(doc) != field or not any(related(field, path) for path, _ in refusals):
            wrong.append((name, pydantic_refusal(doc), field, refusals))
    assert wrong == []
    every = {rule["message"] for _, rule in rules()}
    assert every - hit == set(), "a CEL rule no case refuses"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_as_written_and_fully_dumped_pass_every_rule(path: Path) -> None:
    assert cel_refusals(yaml.safe_load(path.read_text())) == []
    assert cel_refusals(dump_rljob(load_rljob(path))) == []  # every field, nulls and unused defaults included


def test_each_rule_compiles_names_fields_of_its_node_and_names_a_field_to_fix() -> None:
    assert len(rules()) >= 40
    for path, rule in rules():
        node = SCHEMA
        for part in re.findall(r"\w+|\[\]", path):
            node = node["items"] if part == "[]" else node["properties"][part]
        cel.compile(rule["rule"])
        for chain, call in re.findall(r"self((?:\.\w+)+)(\(?)", rule["rule"]):  # every self.a.b is in the schema
            sub = node
            names = chain.strip(".").split(".")
            for name in names[:-1] if call else names:  # self.reward.all(...): `all` is a macro
                assert name in (sub.get("properties") or {}), f"{path}: {rule['rule']}: no field {chain}"
                sub = sub["properties"][name]
        if "fieldPath" in rule:
            sub = node
            for name in rule["fieldPath"].strip(".").split("."):
                sub = sub["properties"][name]
        assert re.match(r"(spec\.|accelerator\.)", rule["message"]), rule["message"]
