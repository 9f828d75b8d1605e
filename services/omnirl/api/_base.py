"""The base class of every RLJob spec model, and the CRD's copies of its cross-field checks (`CelRule`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, ClassVar, get_args

from pydantic import BaseModel, ConfigDict


@dataclass(frozen=True)
class CelRule:
    """One `x-kubernetes-validations` rule of a spec model: the CRD's copy of a check that the model's
    pydantic validator owns (its meaning, its full message), so `kubectl apply` refuses what the operator
    would mark InvalidSpec. `tests/api/test_api_cel.py` evaluates each rule against the validator on the same
    manifests, accepted and refused.

    Attributes:
        rule: CEL over `self`, this model's object. `{name}` stands for the field `name` of `self` with its
            pydantic default when absent (`(has(self.name) ? self.name : DEFAULT)`): the CRD carries no
            defaults (pydantic applies them), so a rule reads an absent field as the operator will. Use
            `has()` for fields without a default; a null counts as absent (as in Kubernetes).
        message: what the API server says: the field's path from `spec` and the fix.
        field: the field the refusal points at, relative to `self` (`fieldPath`, e.g. `.rank`).
    """

    rule: str
    message: str
    field: str | None = None

    def render(self, model: type[BaseModel]) -> dict[str, Any]:
        """The rule as a CRD `x-kubernetes-validations` item for `model`, placeholders filled:
        `{a.b}` → `(has(self.a) && has(self.a.b) ? self.a.b : DEFAULT)`, `{default.a}` → the default alone.

        Raises:
            ValueError: a placeholder that is not a field path of `model`, or whose default depends on
                which parent is absent (write that rule out by hand).
        """
        def value(match: re.Match[str]) -> str:
            path = match[2].split(".")
            default = cel_literal(field_default(model, path))
            if match[1]:
                return default
            tests = " && ".join(f"has(self.{'.'.join(path[:i + 1])})" for i in range(len(path)))
            return f"({tests} ? self.{match[2]} : {default})"

        out = {"rule": re.sub(r"\{(default\.)?([\w.]+)\}", value, self.rule), "message": self.message}
        if self.field:
            out["fieldPath"] = self.field
        return out


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model class of a field annotation (`X`, `X | None`), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)), None)


def field_default(model: type[BaseModel], path: list[str]) -> Any:
    """The value pydantic gives `self.<path>` when the last field of `path` is absent: one value whichever of
    its parents are absent.

    Raises:
        ValueError: `path` does not name a field, or a parent's default holds another value than the field's
            own default (e.g. a `default_factory` that sets it).
    """
    values = []
    for i, name in enumerate(path):
        if name not in model.model_fields:
            raise ValueError(f"{'.'.join(path)}: {model.__name__} has no field {name!r}")
        info = model.model_fields[name]
        values.append(info.get_default(call_default_factory=True))
        if i < len(path) - 1:
            model = _model_of(info.annotation)
            if model is None:
                raise ValueError(f"{'.'.join(path)}: {name!r} is not a model")
    own = values[-1]
    for i, parent in enumerate(values[:-1]):  # the parent absent: its default's value of the rest of the path
        for name in path[i + 1:]:
            parent = getattr(parent, name, own) if parent is not None else own
        if parent != own:
            raise ValueError(f"{'.'.join(path)}: the default is {own!r}, but {parent!r} when {path[i]} is absent")
    return own


def cel_literal(value: Any) -> str:
    """A CEL literal of a default: floats keep a decimal point (CEL's double), tuples become lists.

    Raises:
        TypeError: a value CEL has no literal for here (a model, None).
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if "." in repr(value) or "e" in repr(value) else f"{value}.0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value).replace('"', "'") if "'" not in value else json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(cel_literal(v) for v in value) + "]"
    raise TypeError(f"no CEL literal for the default {value!r}")


def _cel_rules(schema: dict[str, Any], model: type[BaseModel]) -> None:
    rules = getattr(model, "cel_rules", ())
    if rules:
        schema["x-kubernetes-validations"] = [r.render(model) for r in rules]


class SpecModel(BaseModel):
    """Base: camelCase field names as in Kubernetes manifests; unknown fields are errors.

    `cel_rules`: the model's cross-field checks that CEL can state exactly, copied into the CRD
    (`CelRule`); the pydantic validator beside them stays the owner of each check."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False,
                              json_schema_extra=_cel_rules)
    cel_rules: ClassVar[tuple[CelRule, ...]] = ()
