"""`omnirl validate` and the manifest loader: one precise line per problem, exit codes 0/2."""

from __future__ import annotations

import copy
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from omnirl.api.errors import ManifestError
from omnirl.api.exits import USAGE_EXIT
from omnirl.api.extensions import REWARD_KINDS
from omnirl.api.loader import dump_rljob, job_from_dict, load_rljob, load_rljobs, resolve_paths, validate_files
from omnirl.api.spec_algorithm import ALGORITHMS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
OMNIRL = Path(sys.executable).parent / "omnirl"
BASE = ROOT / "examples" / "ocr-flowgrpo.yaml"


def _base() -> dict[str, Any]:
    return yaml.safe_load(BASE.read_text())


def _write(tmp_path: Path, doc: dict[str, Any] | str, name: str = "job.yaml") -> str:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return str(p)


def _problems(path: str) -> list[str]:
    out = io.StringIO()
    assert validate_files([path], out) == 2
    return out.getvalue().splitlines()


def test_examples_exist_and_validate() -> None:
    names = {p.name for p in EXAMPLES}
    # the GPU recipes docs/gpu.md names (one GPU: SD3, FLUX; one 8-GPU node) among them
    assert {"ocr-flowgrpo.yaml", "ocr-nft.yaml", "gpu-sd3-flowgrpo.yaml", "ascend-qwen-image-nft.yaml",
            "gpu-sd3-1gpu.yaml", "gpu-flux-1gpu.yaml", "gpu-sd3-8gpu.yaml"} <= names
    out = io.StringIO()
    assert validate_files([str(p) for p in EXAMPLES], out) == 0
    assert out.getvalue().splitlines() == [f"{p}: ok" for p in EXAMPLES]


def test_console_script_exit_codes(tmp_path: Path) -> None:
    ok = subprocess.run([str(OMNIRL), "validate", *map(str, EXAMPLES)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.count(": ok\n") == len(EXAMPLES)
    bad = _write(tmp_path, BASE.read_text().replace("groupSize: 8", "groupSize: 1"))
    res = subprocess.run([str(OMNIRL), "validate", str(BASE), bad], capture_output=True, text=True)
    assert res.returncode == USAGE_EXIT
    assert res.stdout.splitlines() == [
        f"{BASE}: ok",
        "  ocr-flowgrpo: σ grid: family default (ocr-digits), shift 1, 10 steps: 1.0000, 0.9000 … 0.1000, 0.0000",
        "  ocr-flowgrpo: tensors: transferQueue.tensorTtlSeconds 3600 s must outlive checkpoint.everySteps (20) for an "
        "actor restart to replay a batch: keep a training step under 180 s (the run warns past 50% of the TTL)",
        f"{bad}: spec.algorithm.groupSize: 1 is invalid: must be >= 2 (line 23)",
    ]


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[last] = value
    return doc


BAD = [
    # (field to set, value, the one line expected after "FILE: ")
    (
        "spec.algorithm.grupSize",
        8,
        "spec.algorithm.grupSize: unknown field (did you mean groupSize?); allowed: name, steps, groupSize, "
        "promptsPerStep, sampling, advantage, optimizer, flowGrpo, nft, awm, dgpo",
    ),
    ("spec.algorithm.groupSize", "eight", 'spec.algorithm.groupSize: "eight" is invalid: must be an integer'),
    ("spec.algorithm.groupSize", "8", 'spec.algorithm.groupSize: "8" is invalid: must be an integer'),
    (
        "spec.algorithm.flowGrpo.window.range",
        [4, 12],
        "spec.algorithm.flowGrpo.window.range: [4, 12] is invalid: hi must be <= sampling.numSteps - 1 = 9 "
        "(the last denoising step is never trained)",
    ),
    ("spec.algorithm.groupSize", 1, "spec.algorithm.groupSize: 1 is invalid: must be >= 2"),
    ("spec.algorithm.flowGrpo.clipRange", -0.1, "spec.algorithm.flowGrpo.clipRange: -0.1 is invalid: must be > 0"),
    (
        "spec.roles.actor.accelerator.type",
        "tpu",
        'spec.roles.actor.accelerator.type: "tpu" is invalid: must be one of: nvidia, ascend, cpu',
    ),
    (
        "spec.reward.0.kind",
        "clip",
        f'spec.reward[0].kind: "clip" is invalid: must be one of: {", ".join(REWARD_KINDS)}',  # the registered kinds
    ),
    (
        "spec.reward.0.params.alphabet",
        [1],
        "spec.reward[0].params.alphabet: [1] is invalid: must be one of the types: string, integer, number, boolean",
    ),
    (
        "spec.algorithm.flowGrpo.window.range",
        [1],
        "spec.algorithm.flowGrpo.window.range: [1] is invalid: must have exactly 2 items",
    ),
    ("spec.data.trainPrompts", None, "spec.data.trainPrompts: null is invalid: must be a string"),
    (
        "spec.roles.controller.replicas",
        2,
        "spec.roles.controller.replicas: 2 is invalid: must be 1 (one controller per job)",
    ),
    ("apiVersion", "omnirl.dev/v1", 'apiVersion: "omnirl.dev/v1" is invalid: must be one of: omnirl.dev/v1alpha1'),
    ("kind", "Deployment", 'kind: "Deployment" is invalid: must be RLJob (apiVersion omnirl.dev/v1alpha1)'),
]


@pytest.mark.parametrize("field,value,expected", BAD, ids=[f"{b[0]}={b[1]!r}" for b in BAD])
def test_each_bad_field_gives_exactly_one_line(tmp_path: Path, field: str, value: Any, expected: str) -> None:
    path = _write(tmp_path, _set(_base(), field, value))
    lines = _problems(path)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{path}: {expected} (line "), lines[0]


def test_line_number_points_at_the_field(tmp_path: Path) -> None:
    text = BASE.read_text().replace("groupSize: 8", "groupSize: 1")
    lineno = next(i for i, line in enumerate(text.splitlines(), 1) if "groupSize: 1" in line)
    assert _problems(_write(tmp_path, text))[0].endswith(f"(line {lineno})")


def test_missing_field_and_several_problems(tmp_path: Path) -> None:
    doc = _base()
    del doc["spec"]["data"]["trainPrompts"]
    doc["spec"]["algorithm"]["steps"] = 0
    lines = _problems(_write(tmp_path, doc))
    assert [line.split(": ", 1)[1].split(" (line")[0] for line in lines] == [
        "spec.data.trainPrompts: required field is missing",
        "spec.algorithm.steps: 0 is invalid: must be >= 1",
    ]


def test_duplicate_keys_are_problems(tmp_path: Path) -> None:
    text = BASE.read_text().replace("    groupSize: 8\n", "    groupSize: 8\n    groupSize: 4\n")
    first = text.splitlines().index("    groupSize: 8") + 1
    lines = _problems(_write(tmp_path, text))
    assert lines == [
        f"{tmp_path / 'job.yaml'}: spec.algorithm.groupSize: duplicate key; it is also set at line {first} "
        f"(line {first + 1})"
    ]


def test_yaml_syntax_error_names_line_and_column(tmp_path: Path) -> None:
    text = "apiVersion: omnirl.dev/v1alpha1\nkind: RLJob\nmetadata:\n  name: x\n   bad: [1\n"
    lines = _problems(_write(tmp_path, text))
    assert lines == [
        f"{tmp_path / 'job.yaml'}: YAML syntax error at line 5, column 7: mapping values are not allowed here"
    ]


def test_json_manifest_and_json_syntax_error(tmp_path: Path) -> None:
    good = _write(tmp_path, json.dumps(_base()), "job.json")
    assert load_rljob(good).metadata.name == "ocr-flowgrpo"
    bad = _write(tmp_path, '{"kind": ', "bad.json")
    assert _problems(bad) == [f"{bad}: JSON syntax error at line 1, column 10: Expecting value"]


def test_multi_document_file_checks_every_document(tmp_path: Path) -> None:
    second = _set(_set(_base(), "metadata.name", "second"), "spec.algorithm.steps", -3)
    text = BASE.read_text() + "---\n" + yaml.safe_dump(second, sort_keys=False) + "---\n"
    path = _write(tmp_path, text)
    lines = _problems(path)
    assert len(lines) == 1 and "spec.algorithm.steps: -3 is invalid: must be >= 1" in lines[0]
    third = BASE.read_text() + "---\n" + yaml.safe_dump(_set(_base(), "metadata.name", "b"))
    jobs = load_rljobs(_write(tmp_path, third, "two.yaml"))
    assert [j.metadata.name for j in jobs] == ["ocr-flowgrpo", "b"]
    with pytest.raises(ManifestError) as raised:
        load_rljob(tmp_path / "two.yaml")
    assert raised.value.problems == [f"{tmp_path / 'two.yaml'}: holds 2 RLJob documents (ocr-flowgrpo, b); this "
                                     "command takes exactly one: split the file, one RLJob per file (kubectl apply "
                                     "-f takes the file as it is)"]
    out = io.StringIO()  # accepted, but not silently: `omnirl run two.yaml` refuses the file
    assert validate_files([str(tmp_path / "two.yaml")], out) == 0
    assert out.getvalue().splitlines() == [f"{tmp_path / 'two.yaml'}: ok", "  2 RLJobs in one file: kubectl apply -f "
                                           "takes them all; omnirl run and omnirl render take one RLJob per file: "
                                           "split the file for those"]


def test_non_mapping_and_empty_documents(tmp_path: Path) -> None:
    assert "is a list, not a mapping" in _problems(_write(tmp_path, "- 1\n- 2\n"))[0]
    assert "no YAML document found" in _problems(_write(tmp_path, "# nothing\n", "empty.yaml"))[0]
    assert _problems(str(tmp_path / "missing.yaml"))[0].startswith(f"{tmp_path / 'missing.yaml'}: cannot read:")
    assert validate_files([], io.StringIO()) == 2


def test_yaml12_floats_are_numbers(tmp_path: Path) -> None:
    text = re.sub(r"clipRange: \S+", "clipRange: 1e-4", BASE.read_text())
    text = re.sub(r"learningRate: \S+", "learningRate: 3E-4", text)
    job = load_rljob(_write(tmp_path, text))
    assert job.spec.algorithm.flowGrpo.clipRange == 1e-4
    assert job.spec.algorithm.optimizer.learningRate == 3e-4


def test_relative_paths_resolve_against_the_manifest(tmp_path: Path) -> None:
    sub = tmp_path / "jobs"
    sub.mkdir()
    doc = _set(_set(_base(), "spec.model.family", "sd3"), "spec.model.path", "../models/sd3")
    doc["spec"]["data"]["validationPrompts"] = "/abs/heldout.txt"
    job = load_rljob(_write(sub, doc))
    assert job.spec.data.trainPrompts == str(sub / "prompts" / "ocr-train-pool.txt")
    assert job.spec.data.validationPrompts == "/abs/heldout.txt"
    assert job.spec.model.path == str(tmp_path / "models" / "sd3")
    builtin = load_rljob(BASE)
    assert builtin.spec.model.path == "builtin"
    assert os.path.isfile(builtin.spec.data.trainPrompts), "examples/prompts/ocr-train-pool.txt is missing"
    again = resolve_paths(job, "/elsewhere")  # already absolute: unchanged
    assert again.spec == job.spec


def test_round_trip_dump_and_load() -> None:
    for path in EXAMPLES:
        job = load_rljob(path)
        d = dump_rljob(job)
        assert json.loads(json.dumps(d)) == d  # JSON-compatible
        algo = job.spec.algorithm
        own = ALGORITHMS[algo.name].settings
        assert d["spec"]["algorithm"][own] == algo.settings().model_dump(mode="json")
        assert not set(algo.unused_blocks()) & set(d["spec"]["algorithm"])  # refused if written: never dumped
        assert job_from_dict(d) == job
        assert dump_rljob(job_from_dict(d)) == d
