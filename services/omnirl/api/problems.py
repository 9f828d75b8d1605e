"""Turn a pydantic `ValidationError` into one readable line per bad field.

A line reads `PATH: VALUE is invalid: REQUIREMENT`, e.g.
`spec.algorithm.groupSize: 1 is invalid: must be >= 2`; an unknown field reads
`spec.algorithm.grupSize: unknown field (did you mean groupSize?); allowed: name, steps, ...`.
The path is dotted with list indices in brackets (`spec.reward[0].kind`). Allowed values of a
`Literal` and allowed field names come from the model classes, so they never drift from the spec.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from omnirl.api.errors import FieldProblem, FieldProblems, format_value

Loc = tuple[str | int, ...]

_TYPE_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "mapping", list: "list"}


def _num(x: Any) -> str:
    """A bound as written by people: `0.0` → `0`, `1e-4` stays."""
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


_REQUIREMENTS: dict[str, Callable[[dict[str, Any]], str]] = {
    "greater_than": lambda c: f"must be > {_num(c['gt'])}",
    "greater_than_equal": lambda c: f"must be >= {_num(c['ge'])}",
    "less_than": lambda c: f"must be < {_num(c['lt'])}",
    "less_than_equal": lambda c: f"must be <= {_num(c['le'])}",
    "multiple_of": lambda c: f"must be a multiple of {_num(c['multiple_of'])}",
    "int_type": lambda c: "must be an integer",
    "int_parsing": lambda c: "must be an integer",
    "int_from_float": lambda c: "must be an integer",
    "float_type": lambda c: "must be a number",
    "float_parsing": lambda c: "must be a number",
    "finite_number": lambda c: "must be a finite number",
    "bool_type": lambda c: "must be true or false",
    "bool_parsing": lambda c: "must be true or false",
    "string_type": lambda c: "must be a string",
    "model_type": lambda c: "must be a mapping",
    "model_attributes_type": lambda c: "must be a mapping",
    "dict_type": lambda c: "must be a mapping",
    "list_type": lambda c: "must be a list",
    "tuple_type": lambda c: "must be a list",
    "too_short": lambda c: f"must have at least {c['min_length']} item(s)",
    "too_long": lambda c: f"must have at most {c['max_length']} item(s)",
    "string_too_short": lambda c: f"must be at least {c['min_length']} character(s) long",
    "string_too_long": lambda c: f"must be at most {c['max_length']} characters long",
    "string_pattern_mismatch": lambda c: f"must match the regular expression {c['pattern']}",
    "datetime_type": lambda c: "must be an RFC 3339 date-time",
    "datetime_parsing": lambda c: "must be an RFC 3339 date-time",
    "datetime_from_date_parsing": lambda c: "must be an RFC 3339 date-time",
    "timezone_aware": lambda c: "must be an RFC 3339 date-time with a time zone",
}


def _strip_optional(ann: Any) -> Any:
    """`X | None` → `X`; anything else unchanged."""
    if get_origin(ann) in (Union, types.UnionType):
        args = [a for a in get_args(ann) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return ann


def _unwrap(ann: Any) -> Any:
    """Remove `Annotated[...]` layers."""
    while get_origin(ann) is typing.Annotated:
        ann = get_args(ann)[0]
    return ann


def _is_union(ann: Any) -> bool:
    return get_origin(ann) in (Union, types.UnionType)


def _child(ann: Any, part: str | int) -> Any:
    """The annotation one step down from `ann` along a loc element (None when unknown)."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        field = ann.model_fields.get(part) if isinstance(part, str) else None
        return field.annotation if field else None
    origin, args = get_origin(ann), get_args(ann)
    if origin in (list, tuple) and isinstance(part, int):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return args[part] if part < len(args) else None
        return args[0] if args else None
    if origin is dict and args:
        return args[1]
    return None


def walk(root: type[BaseModel], loc: Loc) -> tuple[list[str | int], Any, Any]:
    """Follow a pydantic error location through the model classes.

    Union member tags that pydantic inserts into `loc` (e.g. `'str'`, `'int'`) are dropped.

    Returns:
        (path, annotation, parent annotation): the location without union tags, the annotation of
        the field it points at and of its parent (None where the location leaves the models).
    """
    path: list[str | int] = []
    ann: Any = root
    parent: Any = None
    for part in loc:
        ann = _strip_optional(_unwrap(ann))
        if _is_union(ann):  # `part` is pydantic's tag naming the member tried: not a field
            continue
        parent, ann = ann, (_unwrap(_child(ann, part)) if ann is not None else None)
        path.append(part)
    return path, _strip_optional(ann) if ann is not None else None, parent


def dotted(path: list[str | int]) -> str:
    """`['spec', 'reward', 0, 'kind']` → `spec.reward[0].kind`."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(document)"


def _allowed_fields(model: Any) -> list[str]:
    if isinstance(model, type) and issubclass(model, BaseModel):
        return [f.alias or name for name, f in model.model_fields.items()]
    return []


def _describe_union(ann: Any) -> str:
    names = [_TYPE_NAMES.get(_unwrap(a), getattr(a, "__name__", str(a))) for a in get_args(ann)]
    return "must be one of the types: " + ", ".join(names)


def requirement_text(err: dict[str, Any], ann: Any) -> str:
    """What is allowed at the erroneous field, phrased to follow 'is invalid:'."""
    kind = err["type"]
    if kind in ("literal_error", "enum") and get_origin(ann) is Literal:
        return "must be one of: " + ", ".join(str(v) for v in get_args(ann))
    if kind in ("literal_error", "enum"):
        return f"must be one of: {err.get('ctx', {}).get('expected', '?')}"
    make = _REQUIREMENTS.get(kind)
    if make is not None:
        try:
            return make(err.get("ctx", {}))
        except KeyError:
            pass
    msg = err["msg"]
    return msg[0].lower() + msg[1:] if msg else kind


def _lines(root: type[BaseModel], err: dict[str, Any]) -> list[tuple[list[str | int], str]]:
    """(path, line text without the file prefix) for one pydantic error: one, or one per problem of
    a `FieldProblems` (a check that found several, e.g. every refused env entry of a template)."""
    problem = err.get("ctx", {}).get("error") if err["type"] == "value_error" else None
    if not isinstance(problem, FieldProblem):
        return [_one_line(root, err)]
    base, _, _ = walk(root, tuple(err["loc"]))
    found = []
    for one in problem.problems if isinstance(problem, FieldProblems) else [problem]:
        path = list(base)  # a cross-field check: its path is relative to the model's
        for part in one.path.replace("[", ".[").split("."):
            path.append(int(part[1:-1]) if part.startswith("[") else part)
        found.append((path, f"{dotted(path)}: {format_value(one.value)} is invalid: {one.requirement}"))
    return found


def _one_line(root: type[BaseModel], err: dict[str, Any]) -> tuple[list[str | int], str]:
    """(path, line text without the file prefix) for one pydantic error (not a `FieldProblem`: `_lines`)."""
    path, ann, parent = walk(root, tuple(err["loc"]))
    kind, value = err["type"], err["input"]
    if kind == "extra_forbidden":
        allowed = _allowed_fields(parent)
        hint = difflib.get_close_matches(str(path[-1]), allowed, n=1)
        did_you_mean = f" (did you mean {hint[0]}?)" if hint else ""
        return path, f"{dotted(path)}: unknown field{did_you_mean}; allowed: {', '.join(allowed)}"
    elif kind == "missing" and get_origin(parent) is tuple and path:  # a fixed-length list too short
        path = path[:-1]
        requirement = f"must have exactly {len(get_args(parent))} items"
    elif kind == "missing":
        return path, f"{dotted(path)}: required field is missing"
    elif kind == "too_long" and get_origin(ann) is tuple:
        requirement = f"must have exactly {len(get_args(ann))} items"
    elif kind == "value_error":
        requirement = err["msg"].removeprefix("Value error, ")
    else:
        requirement = requirement_text(err, ann)
    return path, f"{dotted(path)}: {format_value(value)} is invalid: {requirement}"


def problem_lines(root: type[BaseModel], exc: ValidationError) -> list[tuple[list[str | int], str]]:
    """One (path, text) per bad field of `exc`, in pydantic's order.

    Several errors at one path (pydantic reports each member of a union it tried) become one line
    listing the types the union allows.
    """
    by_path: dict[str, tuple[list[str | int], str]] = {}
    counts: dict[str, int] = {}
    found = [(path, text, err) for err in exc.errors() for path, text in _lines(root, err)]
    for path, text, err in found:
        key = dotted(path)
        counts[key] = counts.get(key, 0) + 1
        if key not in by_path:
            by_path[key] = (path, text)
        elif counts[key] == 2:  # a union: replace the first member's complaint by the whole union's
            _, ann, _ = walk(root, tuple(path))
            by_path[key] = (path, f"{key}: {format_value(err['input'])} is invalid: {_describe_union(ann)}")
    return list(by_path.values())
