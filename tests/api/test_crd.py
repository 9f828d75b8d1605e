"""The generated RLJob CRD: in sync with crds/, structural, and it validates what the spec validates."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from omnirl.api.crd import build_crd, crd_yaml, model_schema, structural_problems, to_json_schema
from omnirl.api.loader import dump_rljob, load_rljob
from omnirl.api.status import Condition, RLJobStatus, RoleStatus, set_condition, utc_now

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def _schema() -> dict[str, Any]:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _validator() -> jsonschema.Draft4Validator:
    schema = to_json_schema(_schema())
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


def test_checked_in_crd_is_up_to_date() -> None:
    on_disk = (ROOT / "crds" / "rljob.yaml").read_text()
    assert on_disk == crd_yaml(), "crds/rljob.yaml is stale: run `make crd`"


def test_crd_names_version_subresource_and_columns() -> None:
    crd = build_crd()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "rljobs.omnirl.dev" and spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "RLJob",
        "listKind": "RLJobList",
        "plural": "rljobs",
        "singular": "rljob",
        "shortNames": ["rlj"],
        "categories": ["omnirl"],
    }
    (v,) = spec["versions"]
    assert (v["name"], v["served"], v["storage"], v["subresources"]) == ("v1alpha1", True, True, {"status": {}})
    cols = {c["name"]: c for c in v["additionalPrinterColumns"]}
    assert [n for n, c in cols.items() if not c.get("priority")] == ["Phase", "Steps", "Reward", "Ready", "Reason",
                                                                      "Age"]
    assert cols["Age"] == {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    schema = v["schema"]["openAPIV3Schema"]
    for c in v["additionalPrinterColumns"]:  # every column points at a schema field of the same type
        if c["jsonPath"].startswith(".metadata"):
            continue
        node = schema
        for part in re.findall(r'\[\?\(@\.\w+=="[^"]*"\)\]|[^.\[]+', c["jsonPath"]):
            if part.startswith("[?"):  # a filter on a list: the field it tests is one of the items'
                node = node["items"]
                assert part[5:].split("==")[0] in node["properties"], c
            else:
                node = node["properties"][part]
        assert node["type"] == c["type"], c


def test_schema_is_structural() -> None:
    schema = _schema()
    assert structural_problems(schema) == []
    text = crd_yaml()
    for forbidden in ("$ref", "$defs", "prefixItems", "anyOf", "const:", "default:", "additionalProperties: false"):
        assert forbidden not in text, forbidden
    window = schema["properties"]["spec"]["properties"]["algorithm"]["properties"]["flowGrpo"]["properties"]["window"]
    assert window["properties"]["range"]["items"] == {"type": "integer", "minimum": 0}
    assert window["properties"]["range"]["minItems"] == window["properties"]["range"]["maxItems"] == 2
    clip = schema["properties"]["spec"]["properties"]["algorithm"]["properties"]["flowGrpo"]["properties"]["clipRange"]
    assert (clip["minimum"], clip["exclusiveMinimum"], clip["maximum"]) == (0, True, 1.0)
    template = schema["properties"]["spec"]["properties"]["roles"]["properties"]["actor"]["properties"]["template"]
    assert template["x-kubernetes-preserve-unknown-fields"] is True and template["nullable"] is True
    conds = schema["properties"]["status"]["properties"]["conditions"]
    assert conds["x-kubernetes-list-type"] == "map" and conds["x-kubernetes-list-map-keys"] == ["type"]
    assert schema["properties"]["metadata"] == {"type": "object"}


@pytest.mark.parametrize(
    "bad,expected",
    [
        ({"type": "object", "properties": {"a": {"description": "no type"}}}, "properties.a: no type"),
        ({"type": "object", "properties": {"a": {"$ref": "#/x"}}}, "key '$ref' is not allowed"),
        (
            {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False},
            "additionalProperties: false is not allowed",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "string"}},
            "mutually exclusive",
        ),
        (
            {
                "type": "object",
                "properties": {
                    "a": {
                        "x-kubernetes-preserve-unknown-fields": True,
                        "anyOf": [{"type": "string"}, {"type": "integer"}],
                    }
                },
            },
            "not allowed inside anyOf",
        ),
        (
            {"type": "array", "items": {"type": "array", "prefixItems": [{"type": "integer"}]}},
            "openAPIV3Schema.items: array without items",
        ),
        ({"type": "array", "items": {"type": "array", "items": {"minimum": 0}}}, "items.items: no type"),
        (
            {
                "type": "object",
                "properties": {"metadata": {"type": "object", "properties": {"name": {"type": "string"}}}},
            },
            "only `type: object`",
        ),
        (
            {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
                "items": {"type": "object", "properties": {"type": {"type": "string"}}},
            },
            "must be required in items",
        ),
    ],
)
def test_structural_checker_catches_each_rule(bad: dict[str, Any], expected: str) -> None:
    problems = structural_problems(bad)
    assert any(expected in p for p in problems), problems


def test_crd_object_passes_kubernetes_validate_strict() -> None:
    kubernetes_validate.validate(build_crd(), "1.30", strict=True)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_schema_accepts_examples_as_written_and_fully_dumped(path: Path) -> None:
    v = _validator()
    as_written = yaml.safe_load(path.read_text())
    assert sorted(e.message for e in v.iter_errors(as_written)) == []
    full = dump_rljob(load_rljob(path))  # every field, nulls included
    assert sorted(e.message for e in v.iter_errors(full)) == []


def _errors(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return [(".".join(map(str, e.absolute_path)), e.validator) for e in _validator().iter_errors(doc)]


@pytest.mark.parametrize(
    "field,value,validator",
    [
        ("spec.algorithm.groupSize", "eight", "type"),
        ("spec.algorithm.groupSize", 1, "minimum"),
        ("spec.algorithm.flowGrpo.clipRange", 0.0, "minimum"),  # exclusive: 0 itself is out
        ("spec.algorithm.flowGrpo.window.range", [0, 1, 2], "maxItems"),
        ("spec.roles.rollout.accelerator.type", "tpu", "enum"),
        ("spec.pipeline.mode", "async", "enum"),
        ("spec.model.attention", "CUDNN", "enum"),  # the validator's values, case and all
        ("spec.model.attention", "flash", "enum"),
    ],
)
def test_schema_rejects_bad_values(field: str, value: Any, validator: str) -> None:
    doc = copy.deepcopy(yaml.safe_load((ROOT / "examples" / "ocr-flowgrpo.yaml").read_text()))
    *parents, last = field.split(".")
    node = doc
    for k in parents:
        node = node.setdefault(k, {})
    node[last] = value
    assert _errors(doc) == [(field, validator)]


def test_schema_requires_spec_data_and_reward() -> None:
    doc = {"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "x"}, "spec": {}}
    assert sorted(_errors(doc)) == [("spec", "required"), ("spec", "required")]
    assert sorted(_errors({"kind": "RLJob"})) == [("", "required")]


def test_status_schema_accepts_a_real_status() -> None:
    st = RLJobStatus(
        phase="Running",
        roles={"actor": RoleStatus(desired=1, ready=1)},
        readyRoles="1/1",
        step=3,
        conditions=set_condition([], Condition(type="Ready", status="True", reason="AllRolesReady"), utc_now()),
    )
    v = jsonschema.Draft4Validator(to_json_schema(model_schema(RLJobStatus)))
    assert list(v.iter_errors(st.model_dump(mode="json"))) == []
    assert [e.validator for e in v.iter_errors({"phase": "Done"})] == ["enum"]
