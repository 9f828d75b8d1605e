"""A manifest's path-like fields with values no file system (or HTTP request) takes: `omnirl validate` and
`omnirl run` refuse each with exit 2 and one line naming the field (`api/paths.py`), never a traceback.

A 5,000-character `spec.model.path`, `data.trainPrompts` or `data.validationPrompts` ended both commands in
`OSError: [Errno 36] File name too long` from the check that names files not on this machine; a NUL in
`checkpoint.dir` passed both and failed the run's first checkpoint; a byte that is not UTF-8 was refused
naming no field, and a YAML `"\\udcff"` escape as "(document): ... invalid JSON" (issue 31). Every case
fails while the manifest loads, before anything starts, so they run in-process."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from omnirl.cli import main

ROOT = Path(__file__).resolve().parents[2]
BYTE = "@NOT-UTF-8@"  # replaced by the byte 0xff in the file written
SERVER = {"command": ["omnirl-judge", "{port}"], "urlPath": "/v1/score"}
# field as a problem line names it → how to set it in the NFT example's spec
FIELDS = {
    "spec.model.path": lambda spec, v: spec["model"].update(path=v),
    "spec.data.trainPrompts": lambda spec, v: spec["data"].update(trainPrompts=v),
    "spec.data.validationPrompts": lambda spec, v: spec["data"].update(validationPrompts=v),
    "spec.checkpoint.dir": lambda spec, v: spec["checkpoint"].update(dir=v.lstrip("/")),
    "spec.reward[1].server.modelPath": lambda spec, v: spec["reward"].append(
        {"name": "judge", "kind": "http", "server": {**SERVER, "modelPath": v}}),
    "spec.reward[1].server.command[0]": lambda spec, v: spec["reward"].append(
        {"name": "judge", "kind": "http", "server": {**SERVER, "command": [v, "{port}"]}}),
    "spec.reward[1].server.urlPath": lambda spec, v: spec["reward"].append(
        {"name": "judge", "kind": "http", "server": {**SERVER, "urlPath": v}}),
    "spec.reward[1].server.healthPath": lambda spec, v: spec["reward"].append(
        {"name": "judge", "kind": "http", "server": {**SERVER, "healthPath": v}}),
}
URL_PATHS = ("spec.reward[1].server.urlPath", "spec.reward[1].server.healthPath")
VALUES = {  # what each is refused for
    "over-long": ("/" + "/".join(["a" * 200] * 25), "bytes long"),  # 5,026 bytes of 200-byte names
    "over-long name": ("/srv/" + "b" * 300, "NAME_MAX"),
    "NUL": ("/srv/a\x00b", "\\x00"),  # named as the escape it is written as
    "escaped non-UTF-8": ("/srv/\udcff", "not valid UTF-8"),
    "non-UTF-8 byte": (f"/srv/{BYTE}", "not valid UTF-8 (byte 0xff"),
}
CASES = [(field, kind) for field in FIELDS for kind in VALUES if not (field in URL_PATHS and kind == "over-long name")]


def manifest(tmp: Path, field: str, value: str) -> Path:
    """The NFT example with `field` set to `value`, written as YAML (escapes for NUL and lone surrogates)."""
    doc = yaml.safe_load((ROOT / "examples" / "ocr-nft.yaml").read_text())
    doc["spec"]["data"] = {"trainPrompts": str(ROOT / "examples/prompts/ocr-train.txt")}
    FIELDS[field](doc["spec"], value)
    path = tmp / "job.yaml"
    path.write_bytes(yaml.safe_dump(doc, allow_unicode=False, width=1 << 16).encode().replace(BYTE.encode(), b"\xff"))
    return path


@pytest.fixture(autouse=True)
def _nothing_starts(monkeypatch):
    """`omnirl run` never gets past loading the manifest here: a manifest it accepted would start a whole job."""
    def accepted(*_args, **_kwargs):
        raise AssertionError("omnirl run accepted the manifest and went on to place its roles")

    monkeypatch.setattr("omnirl.launch.local.place", accepted)


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize(("field", "kind"), CASES, ids=[f"{f}-{k}" for f, k in CASES])
def test_a_path_field_no_file_system_takes_is_one_line_naming_it(field, kind, command, tmp_path, capsys):
    value, why = VALUES[kind]
    path = manifest(tmp_path, field, value)
    args = ["run", str(path), "--out", str(tmp_path / "out"), "--no-ray"] if command == "run" else ["validate", str(path)]
    assert main(args) == 2
    captured = capsys.readouterr()
    printed = captured.out if command == "validate" else captured.err  # validate lists its problems on stdout
    lines = printed.splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.out + captured.err, printed
    assert f"{path}: {field}:" in lines[0] and why in lines[0], lines[0]
    assert len(lines[0]) < 400  # the value is cut, not printed whole
    assert not (tmp_path / "out").exists()  # refused before anything started


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_relative_path_too_long_once_joined_to_the_manifests_folder_is_one_line(command, tmp_path, capsys):
    """4,079 bytes as written (under PATH_MAX), over it once resolved against the manifest's folder."""
    path = manifest(tmp_path, "spec.model.path", "/".join(["m" * 203] * 20))
    args = ["run", str(path), "--out", str(tmp_path / "out"), "--no-ray"] if command == "run" else ["validate", str(path)]
    assert main(args) == 2
    captured = capsys.readouterr()
    lines = (captured.out if command == "validate" else captured.err).splitlines()
    assert len(lines) == 1 and f"{path}: spec.model.path:" in lines[0] and "resolved against the manifest's folder" \
        in lines[0], lines


def test_paths_at_the_limits_are_accepted(tmp_path, capsys):
    """A name of 255 bytes and an HTTP path with a 300-byte segment are fine (only missing on this machine)."""
    path = manifest(tmp_path, "spec.reward[1].server.modelPath", "/srv/" + "c" * 255)
    assert main(["validate", str(path)]) == 0
    assert "spec.reward[1].server.modelPath" not in capsys.readouterr().out
    path = manifest(tmp_path, "spec.reward[1].server.healthPath", "/" + "h" * 300)
    assert main(["validate", str(path)]) == 0
