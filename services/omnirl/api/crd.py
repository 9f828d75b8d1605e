"""The RLJob CustomResourceDefinition, generated from the pydantic spec and status models.

`build_crd()` turns `RLJobSpec.model_json_schema()` and `RLJobStatus.model_json_schema()` into a
*structural* OpenAPI v3 schema, as apiextensions.k8s.io/v1 requires
(https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#specifying-a-structural-schema):
`$ref`s inlined; `X | None` becomes `X` + `nullable: true`; tuples become arrays with one `items`
schema and min/maxItems; `const` becomes a one-value `enum`; JSON Schema 2020's numeric
`exclusiveMinimum` becomes OpenAPI 3.0's `minimum` + `exclusiveMinimum: true`; free-form objects
get `x-kubernetes-preserve-unknown-fields`; other unions (reward params' string|number|boolean
values) become untyped preserve-unknown-fields nodes. `title`, `additionalProperties: false` and
defaults are dropped (the API server prunes unknown fields; `omnirl validate` and the operator
reject them, and apply defaults through pydantic); each default is written into its description
for `kubectl explain`. A string enum gets the `maxLength` of its longest value. Each model's
`cel_rules` (`omnirl.api._base.CelRule`: the cross-field checks of its pydantic validators that CEL
states exactly) become its node's `x-kubernetes-validations`, so `kubectl apply` refuses what the
operator would mark InvalidSpec. `crds/rljob.yaml` is `omnirl crd`'s output (`make crd`; a test keeps it
in sync).
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from omnirl.api.spec import API_GROUP, API_VERSION, KIND, RLJobSpec
from omnirl.api.status import RLJobStatus

PLURAL = "rljobs"
CRD_NAME = f"{PLURAL}.{API_GROUP}"

# Keys of apiextensions/v1 JSONSchemaProps that a generated schema may use.
ALLOWED_KEYS = frozenset(
    """type format title description maximum exclusiveMaximum minimum exclusiveMinimum maxLength minLength
    pattern maxItems minItems multipleOf enum maxProperties minProperties required items allOf oneOf anyOf not
    properties additionalProperties nullable example externalDocs x-kubernetes-preserve-unknown-fields
    x-kubernetes-int-or-string x-kubernetes-embedded-resource x-kubernetes-list-type x-kubernetes-list-map-keys
    x-kubernetes-map-type x-kubernetes-validations""".split()
)
_JUNCTORS = ("allOf", "anyOf", "oneOf", "not")
_PRESERVE = "x-kubernetes-preserve-unknown-fields"
_INT_OR_STRING = "x-kubernetes-int-or-string"


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over`'s keys on top (the field's description wins over the class docstring)."""
    return {**base, **over}


def _union(members: list[dict[str, Any]], rest: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """An `anyOf` → one structural node (see the module docstring)."""
    nullable = any(m.get("type") == "null" for m in members)
    typed = [m for m in members if m.get("type") != "null"]
    if len(typed) == 1:
        node = _merge(_structural(typed[0], defs), _structural(rest, defs))
    else:
        types = [str(m.get("type")) for m in typed]
        extra = {_INT_OR_STRING: True} if sorted(types) == ["integer", "string"] else {_PRESERVE: True}
        node = _structural(rest, defs)
        node.update(extra, description=f"{node.get('description', '')} One of: {', '.join(types)}.".strip())
    if nullable:
        node["nullable"] = True
    return node


def _bounds(node: dict[str, Any]) -> None:
    """JSON Schema 2020 numeric exclusive bounds → OpenAPI 3.0 boolean form, in place."""
    for excl, incl in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if excl in node and not isinstance(node[excl], bool):
            node[incl] = node.pop(excl)
            node[excl] = True


def _structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """One pydantic JSON-schema node → a structural OpenAPI v3 node (recursively)."""
    node = dict(schema)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        return _structural(_merge(target, node), defs)
    if "allOf" in node and len(node["allOf"]) == 1:
        return _structural(_merge(node.pop("allOf")[0], node), defs)
    if "anyOf" in node:
        return _union(node.pop("anyOf"), node, defs)
    node.pop("title", None)
    default = node.pop("default", None)
    if default is not None and not isinstance(default, dict):
        desc = node.get("description", "")
        node["description"] = f"{desc} Default: {json.dumps(default)}.".strip()
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if node.get("type") == "string" and node.get("enum") and "maxLength" not in node:
        # bounds the CEL rules' estimated cost (the API server assumes an unbounded string may be megabytes)
        node["maxLength"] = max(len(v) for v in node["enum"])
    if "prefixItems" in node:
        items = [_structural(s, defs) for s in node.pop("prefixItems")]
        if any(i != items[0] for i in items):
            raise ValueError(f"tuple items differ ({items}): a structural array needs one items schema")
        node["items"] = items[0]
    _bounds(node)
    free_form = node.get("additionalProperties")
    if isinstance(free_form, bool):  # false: pruning does it; true: a free-form object
        del node["additionalProperties"]
        if free_form and "properties" not in node:
            node[_PRESERVE] = True
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _structural(node["additionalProperties"], defs)
    if "items" in node:
        node["items"] = _structural(node["items"], defs)
    if "properties" in node:
        node["properties"] = {k: _structural(v, defs) for k, v in node["properties"].items()}
    return node


def model_schema(model: type) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a pydantic model class (validation mode, camelCase)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural({k: v for k, v in raw.items() if k != "$defs"}, raw.get("$defs", {}))


def openapi_schema() -> dict[str, Any]:
    """The whole RLJob object's `openAPIV3Schema`."""
    return {
        "type": "object",
        "description": "RLJob: one reinforcement-learning post-training job of a flow-matching model "
        "(rollout, reward, actor and controller roles exchanging samples through a TransferQueue).",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "omnirl.dev/v1alpha1."},
            "kind": {"type": "string", "description": "RLJob."},
            "metadata": {"type": "object"},
            "spec": model_schema(RLJobSpec),
            "status": model_schema(RLJobStatus),
        },
    }


def _printer_columns() -> list[dict[str, Any]]:
    col = [
        ("Phase", "string", ".status.phase", "Pending, Running, Suspended, Succeeded or Failed.", 0),
        ("Steps", "integer", ".status.step", "Training steps completed (the last checkpoint is step-<Steps - 1>).", 0),
        ("Reward", "number", ".status.rewardMean", "Mean reward of the last training step (raw weighted sum when normalised).", 0),
        ("Ready", "string", ".status.readyRoles", "Roles with all pods ready / roles.", 0),
        # the Ready condition's reason is the phase's: WaitingForPods, Unschedulable, ImagePullBackOff, JudgeFailed ...
        ("Reason", "string", '.status.conditions[?(@.type=="Ready")].reason',
         "Why the job is in its phase (the Ready condition's reason).", 0),
        ("Age", "date", ".metadata.creationTimestamp", "", 0),
        ("Algorithm", "string", ".spec.algorithm.name", "RL algorithm.", 1),
        ("Model", "string", ".spec.model.family", "Model family.", 1),
        ("Version", "integer", ".status.policyVersion", "Policy version on the rollout workers.", 1),
        ("Message", "string", ".status.message", "Summary of the current phase.", 1),
    ]
    out = []
    for name, typ, path, desc, priority in col:
        c: dict[str, Any] = {"name": name, "type": typ, "jsonPath": path}
        if desc:
            c["description"] = desc
        if priority:
            c["priority"] = priority
        out.append(c)
    return out


def build_crd() -> dict[str, Any]:
    """The CustomResourceDefinition (apiextensions.k8s.io/v1) of `rljobs.omnirl.dev`.

    Raises:
        ValueError: the generated schema is not structural (a spec change needs `_structural` to learn
            a new shape); the message lists every offending node.
    """
    schema = openapi_schema()
    problems = structural_problems(schema)
    if problems:
        raise ValueError("generated RLJob schema is not structural:\n" + "\n".join(problems))
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/name": "omnirl"}},
        "spec": {
            "group": API_GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": "rljob",
                "shortNames": ["rlj"],
                "categories": ["omnirl"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": _printer_columns(),
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def crd_yaml() -> str:
    """`build_crd()` as YAML (keys sorted, so the output is stable), with a generated-file header."""
    header = "# Generated by `omnirl crd` from omnirl.api.spec and omnirl.api.status; do not edit (run `make crd`).\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=True, width=110, allow_unicode=True)


def structural_problems(schema: dict[str, Any], path: str = "openAPIV3Schema") -> list[str]:
    """Why `schema` is not a structural v1 CRD schema; an empty list when it is.

    Checks: every node under properties/additionalProperties/items (and the root) has a `type`
    unless it preserves unknown fields or is int-or-string; only JSONSchemaProps keys (no `$ref`,
    `prefixItems`, `const`, defaults); `additionalProperties` never false and never beside
    `properties`; no type/description/nullable/additionalProperties inside anyOf/allOf/oneOf/not;
    no `uniqueItems: true`; map-lists keyed by required fields; root `metadata` unrestricted.
    """
    out: list[str] = []
    keys = set(schema)
    if not ({"type", _PRESERVE, _INT_OR_STRING} & keys) or ("type" in keys and not schema["type"]):
        out.append(f"{path}: no type")
    out += [f"{path}: key {k!r} is not allowed in a CRD schema" for k in sorted(keys - ALLOWED_KEYS)]
    if schema.get("type") == "array" and not isinstance(schema.get("items"), dict):
        out.append(f"{path}: array without items (one items schema is required)")
    if schema.get("additionalProperties") is False:
        out.append(f"{path}: additionalProperties: false is not allowed")
    if "additionalProperties" in schema and "properties" in schema:
        out.append(f"{path}: additionalProperties and properties are mutually exclusive")
    for j in _JUNCTORS:
        for i, branch in enumerate(schema.get(j, []) if j != "not" else [schema.get("not", {})]):
            bad = {"type", "description", "default", "additionalProperties", "nullable"} & set(branch)
            if bad:
                out.append(f"{path}.{j}[{i}]: {sorted(bad)} not allowed inside {j}")
    if schema.get("x-kubernetes-list-type") == "map":
        req = set(schema.get("items", {}).get("required", []))
        missing = set(schema.get("x-kubernetes-list-map-keys", [])) - req
        if missing:
            out.append(f"{path}: list-map keys {sorted(missing)} must be required in items")
    for name, sub in schema.get("properties", {}).items():
        if path == "openAPIV3Schema" and name == "metadata" and set(sub) - {"type"}:
            out.append(f"{path}.properties.metadata: only `type: object` is allowed")
        out += structural_problems(sub, f"{path}.properties.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            out += structural_problems(schema[key], f"{path}.{key}")
    return out


def to_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A structural OpenAPI v3 schema as JSON Schema draft 4, for `jsonschema.Draft4Validator`.

    `nullable: true` becomes a `null` type (and a `None` enum member); int-or-string becomes
    `type: [integer, string]`. Draft 4 reads OpenAPI's boolean `exclusiveMinimum` natively.
    """
    node = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes") and k != "nullable"}
    if schema.get(_INT_OR_STRING):
        node["type"] = ["integer", "string"]
    if schema.get("nullable") and "type" in node:
        node["type"] = [node["type"], "null"] if isinstance(node["type"], str) else [*node["type"], "null"]
        if "enum" in node:
            node["enum"] = [*node["enum"], None]
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            node[key] = to_json_schema(node[key])
    if "properties" in node:
        node["properties"] = {k: to_json_schema(v) for k, v in node["properties"].items()}
    return node
