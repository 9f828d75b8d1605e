"""Read, validate and write RLJob manifests (YAML or JSON).

- `load_rljob(path)` reads a file holding exactly one RLJob and returns it with its relative file
  paths made absolute against the manifest's directory (`resolve_paths`): `spec.data.trainPrompts`,
  `spec.data.validationPrompts` and `spec.model.path` (unless `builtin`). Whether the files exist
  is not checked here: in a cluster they live in the pods, not beside the manifest.
- `load_rljobs(path)` does the same for every document of a multi-document YAML file.
- `validate_files(files, out)` is `omnirl validate`: `FILE: ok`, or one line per problem; exit
  code `DONE` when every file is valid, else `USAGE_EXIT` (`omnirl.api.exits`).
- `dump_rljob` / `job_from_dict` convert to and from plain JSON-compatible dicts (the ConfigMap
  the operator writes, the body kopf hands over). `job_from_dict` does not resolve paths.

Validation is strict, as the API server's is: `groupSize: "8"` is an error, not 8. YAML is read
with YAML 1.2 number rules, so `clipRange: 1e-4` is a number (PyYAML alone reads it as a string).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import yaml
from pydantic import ValidationError

from omnirl.api.errors import ManifestError, format_value
from omnirl.api.exits import DONE, USAGE_EXIT
from omnirl.api.paths import path_problem, printable, utf8_problem
from omnirl.api.problems import dotted, problem_lines
from omnirl.api.spec import API_GROUP, API_VERSION, KIND, RLJob


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads floats per YAML 1.2 (`1e-4`, `1E+3` are numbers, not strings)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def job_from_dict(d: dict[str, Any]) -> RLJob:
    """Validate a manifest dict (strictly, as JSON: no "8" for 8) into an RLJob; paths are kept as written.

    Raises:
        pydantic.ValidationError: the dict is not a valid RLJob (see `problem_lines` for readable lines).
    """
    return RLJob.model_validate_json(json.dumps(d, default=str), strict=True)


def dump_rljob(job: RLJob) -> dict[str, Any]:
    """The full manifest as a JSON-compatible dict: every field, defaults included, camelCase keys.

    Left out: `status` when it is None (a manifest has no `status: null`; the CRD schema has no
    null status), and the settings blocks of the algorithms the job does not run (`spec.algorithm`
    refuses them when written: `AlgorithmSpec.unused_blocks`). `job_from_dict(dump_rljob(job)) ==
    job` holds for every valid job.
    """
    exclude: dict[str, Any] = {"spec": {"algorithm": set(job.spec.algorithm.unused_blocks())}}
    if job.status is None:
        exclude["status"] = True
    return job.model_dump(mode="json", by_alias=True, exclude=exclude)


def resolve_paths(job: RLJob, base_dir: str | os.PathLike[str]) -> RLJob:
    """A copy of `job` whose relative prompt and model paths are absolute, joined to `base_dir`.

    Touches `spec.data.trainPrompts`, `spec.data.validationPrompts` (when set) and `spec.model.path`
    (unless `builtin`); absolute paths are only normalised. `base_dir` is made absolute first.
    """
    base = Path(base_dir).absolute()

    def absolute(p: str) -> str:
        return os.path.normpath(p if os.path.isabs(p) else base / p)

    data = job.spec.data
    data = data.model_copy(
        update={
            "trainPrompts": absolute(data.trainPrompts),
            "validationPrompts": absolute(data.validationPrompts) if data.validationPrompts else None,
        }
    )
    model = job.spec.model
    if model.path != "builtin":
        model = model.model_copy(update={"path": absolute(model.path)})
    spec = job.spec.model_copy(update={"data": data, "model": model})
    return job.model_copy(update={"spec": spec})


# ---------------------------------------------------------------- reading documents


def _read_documents(path: str) -> list[tuple[Any, yaml.Node | None]]:
    """(data, YAML node or None) per non-empty document of the file; raises ManifestError."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise ManifestError([f"{path}: cannot read: {e}"]) from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:  # the field that holds the byte, not only the byte's position
        raise ManifestError([_not_utf8(path, raw, e.start)]) from e
    if path.endswith(".json"):
        try:
            return [(json.loads(text), None)]
        except json.JSONDecodeError as e:
            raise ManifestError([f"{path}: JSON syntax error at line {e.lineno}, column {e.colno}: {e.msg}"]) from e
    loader = _Loader(text)
    docs: list[tuple[Any, yaml.Node | None]] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            docs.append((loader.construct_document(node), node))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ManifestError([f"{path}: YAML syntax error{where}: {e.problem or e.context}"]) from e
    except yaml.YAMLError as e:
        raise ManifestError([f"{path}: YAML error: {e}"]) from e
    finally:
        loader.dispose()
    return [(d, n) for d, n in docs if d is not None]


def _not_utf8(path: str, raw: bytes, at: int) -> str:
    """The problem line of a manifest whose byte `at` is not UTF-8: the field whose value (or key) holds it when
    the file, read with that byte replaced, is YAML (JSON is too), with the byte's line and column."""
    before = raw[:at].decode("utf-8")  # the bytes before the first bad one are UTF-8
    line, column = before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1
    where = f"byte 0x{raw[at]:02x} at line {line}, column {column}"
    try:
        nodes = list(yaml.compose_all(raw.decode("utf-8", "replace"), Loader=yaml.SafeLoader))
    except yaml.YAMLError:
        nodes = []
    field = next((f for n in nodes if (f := _field_at(n, len(before), [])) is not None), None)
    if field is None:
        return f"{path}: is not UTF-8 text ({where}); save the manifest as UTF-8"
    return f"{path}: {dotted(field)}: is not valid UTF-8 ({where}); write the value in UTF-8"


def _field_at(node: yaml.Node, index: int, path: list[str | int]) -> list[str | int] | None:
    """The path of the scalar (a value, or a mapping's key) under `node` whose text spans character `index`."""
    if isinstance(node, yaml.ScalarNode):
        return path if node.start_mark.index <= index < node.end_mark.index else None
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            here = [*path, key.value if isinstance(key, yaml.ScalarNode) else "?"]
            if isinstance(key, yaml.ScalarNode) and key.start_mark.index <= index < key.end_mark.index:
                return here
            found = _field_at(value, index, here)
            if found is not None:
                return found
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found = _field_at(item, index, [*path, i])
            if found is not None:
                return found
    return None


def _line_of(node: yaml.Node | None, path: list[str | int]) -> int | None:
    """1-based line of the deepest YAML node along `path` (a key's line for mapping entries)."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in path:
        if isinstance(node, yaml.MappingNode):
            hit = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
            if hit is None:
                break
            line, node = hit[0].start_mark.line + 1, hit[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def _duplicate_keys(node: yaml.Node | None, path: list[str | int]) -> list[tuple[list[str | int], int, int]]:
    """(path, first line, repeated line) of every mapping key set twice (PyYAML silently keeps the last)."""
    found: list[tuple[list[str | int], int, int]] = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for k, v in node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else None
            if key is not None and key in seen:
                found.append(([*path, key], seen[key], k.start_mark.line + 1))
            elif key is not None:
                seen[key] = k.start_mark.line + 1
            found += _duplicate_keys(v, [*path, key if key is not None else "?"])
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found += _duplicate_keys(item, [*path, i])
    return found


def _not_utf8_strings(data: Any, path: list[str | int]) -> list[tuple[list[str | int], str]]:
    """(path, text) of every key or string value under `data` that is not UTF-8 text (a lone surrogate: YAML's
    `"\\udcff"` escape makes one)."""
    if isinstance(data, str):
        return [(path, data)] if utf8_problem(data) else []
    found: list[tuple[list[str | int], str]] = []
    if isinstance(data, dict):
        for key, value in data.items():
            here = [*path, printable(key) if isinstance(key, str) else str(key)]
            found += [(here, key)] if isinstance(key, str) and utf8_problem(key) else _not_utf8_strings(value, here)
    elif isinstance(data, list):
        for i, item in enumerate(data):
            found += _not_utf8_strings(item, [*path, i])
    return found


def _check_document(path: str, data: Any, node: yaml.Node | None, index: int) -> tuple[RLJob | None, list[str]]:
    """Validate one document: (job, []) or (None, problem lines)."""
    where = f" (document {index + 1})" if index else ""
    if not isinstance(data, dict):
        return None, [
            f"{path}: document {index + 1} is a {type(data).__name__}, not a mapping (an RLJob manifest "
            "has apiVersion, kind, metadata and spec)"
        ]
    if data.get("kind") != KIND:
        line = _line_of(node, ["kind"])
        at = f" (line {line})" if line else where
        return None, [
            f"{path}: kind: {format_value(data.get('kind'))} is invalid: must be {KIND} "
            f"(apiVersion {API_GROUP}/{API_VERSION}){at}"
        ]
    lines = [
        f"{path}: {dotted(loc)}: duplicate key; it is also set at line {first} (line {again})"
        for loc, first, again in _duplicate_keys(node, [])
    ]
    for loc, text in _not_utf8_strings(data, []):  # job_from_dict's JSON refused the whole document for one
        line = _line_of(node, loc)
        lines.append(f"{path}: {dotted(loc)}: {format_value(printable(text))} is invalid: {utf8_problem(text)}"
                     + (f" (line {line})" if line else where))
    if lines:
        return None, lines
    try:
        job = job_from_dict(data)
    except ValidationError as e:
        for loc, text in problem_lines(RLJob, e):
            line = _line_of(node, loc)
            lines.append(f"{path}: {text}" + (f" (line {line})" if line else where))
        return None, lines
    return (None, lines) if lines else (job, [])


def load_rljobs(path: str | os.PathLike[str]) -> list[RLJob]:
    """Every RLJob of a YAML (possibly multi-document) or JSON file, paths resolved (`resolve_paths`).

    Raises:
        ManifestError: the file cannot be read or parsed, has no document, holds a document that is
            not an RLJob, or any document is invalid; `.problems` lists every problem of every document.
    """
    path = os.fspath(path)
    docs = _read_documents(path)
    if not docs:
        raise ManifestError([f"{path}: no YAML document found (expected an RLJob manifest)"])
    jobs: list[RLJob] = []
    problems: list[str] = []
    for i, (data, node) in enumerate(docs):
        job, lines = _check_document(path, data, node, i)
        problems.extend(lines)
        if job is not None:
            jobs.append(job)
    if problems:
        raise ManifestError(problems)
    base = Path(path).absolute().parent
    resolved = [resolve_paths(j, base) for j in jobs]
    # a relative path valid as written can outgrow PATH_MAX once joined to the manifest's folder
    problems = [f"{path}: {field}: {format_value(value)} is invalid: {problem} (resolved against the manifest's "
                "folder)" for job in resolved for field, value, problem in _resolved_path_problems(job)]
    if problems:
        raise ManifestError(problems)
    return resolved


def _resolved_path_problems(job: RLJob) -> list[tuple[str, str, str]]:
    """(field, value, problem) of each path `resolve_paths` made absolute that no longer names a possible file."""
    data, model = job.spec.data, job.spec.model
    fields = [("spec.data.trainPrompts", data.trainPrompts), ("spec.data.validationPrompts", data.validationPrompts),
              ("spec.model.path", model.path)]
    return [(field, value, problem) for field, value in fields
            if value is not None and (problem := path_problem(value)) is not None]


def load_rljob(path: str | os.PathLike[str]) -> RLJob:
    """The one RLJob of a YAML or JSON file, its relative paths resolved against the file's directory.

    Raises:
        ManifestError: as `load_rljobs`, or the file holds more than one RLJob.
    """
    jobs = load_rljobs(path)
    if len(jobs) != 1:
        # the fix, not only the count: a user with a file `kubectl apply -f` takes was left to guess
        raise ManifestError([f"{os.fspath(path)}: holds {len(jobs)} RLJob documents "
                             f"({', '.join(j.metadata.name for j in jobs)}); this command takes exactly one: split "
                             "the file, one RLJob per file (kubectl apply -f takes the file as it is)"])
    return jobs[0]


def validate_files(files: list[str], out: TextIO, describe: Callable[[RLJob], list[str]] | None = None,
                   check: Callable[[RLJob], list[str]] | None = None) -> int:
    """`omnirl validate`: print `FILE: ok` per valid file, else its problem lines, to `out`; a valid
    file of several RLJobs gets a line saying `omnirl run` and `omnirl render` take one per file.

    Args:
        describe: extra lines printed under a valid job's `ok` (the CLI's: its σ grid).
        check: problems of a job whose spec is valid that need more than the spec (the CLI's: LoRA targets
            against the model's layers); any makes the file invalid, each printed as `FILE: problem`.
    Returns:
        `DONE` when every file is valid, `USAGE_EXIT` otherwise (also when `files` is empty).
    """
    ok = bool(files)
    for f in files:
        try:
            jobs = load_rljobs(f)
        except ManifestError as e:
            ok = False
            for line in e.problems:
                out.write(line + "\n")
        else:
            problems = [line for job in jobs for line in (check(job) if check else [])]
            if problems:
                ok = False
                for line in problems:
                    out.write(f"{f}: {line}\n")
                continue
            out.write(f"{f}: ok\n")
            if len(jobs) > 1:  # accepted for the cluster, but `omnirl run` and `render` would refuse the file
                out.write(f"  {len(jobs)} RLJobs in one file: kubectl apply -f takes them all; omnirl run and "
                          "omnirl render take one RLJob per file: split the file for those\n")
            for job in jobs if describe else []:
                for line in describe(job):
                    out.write(f"  {job.metadata.name}: {line}\n")
    return DONE if ok else USAGE_EXIT
