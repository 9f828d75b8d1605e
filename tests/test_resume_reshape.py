"""`omnirl run --resume` of a run stopped mid-step, with a manifest whose groupSize changed: refused at once
with one line naming the field, both values and the fix, before Redis or any role starts; the run directory
is left as it was; a new learning rate (it shapes nothing stored) passes the same check.

Before the fix the resume started and hung: the controller rebuilt the published step's groups with the new
groupSize and waited for ever for samples never requested (measured on 2 prompts × 3 samples stopped after
step 11: groupSize 4, or promptsPerStep 3, and no step trained in 120 s; the step's log line never came)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tests.helpers import wait_until

from omnirl.api.loader import dump_rljob, load_rljob
from omnirl.api.resume import resume_changes
from omnirl.launch import preflight

ROOT = Path(__file__).resolve().parents[1]


def _job(tmp: Path, **algorithm) -> Path:
    doc = yaml.safe_load((ROOT / "examples" / "ocr-flowgrpo.yaml").read_text())
    doc["metadata"]["name"] = "reshape"
    spec = doc["spec"]
    spec["data"] = {"trainPrompts": str(ROOT / "examples/prompts/ocr-train.txt")}
    spec["algorithm"].update(steps=50, groupSize=3, promptsPerStep=2, sampling={"numSteps": 4},
                             optimizer={"learningRate": 1e-4, "microBatchSize": 6, "updatesPerStep": 1})
    spec["algorithm"]["flowGrpo"]["window"] = {"size": 2, "range": [0, 3]}
    spec["algorithm"].update(algorithm)
    spec["checkpoint"] = {"everySteps": 1, "keep": 1}
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _omnirl(job: Path, out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "services"), str(ROOT / "operator"), str(ROOT)])}
    return subprocess.Popen([sys.executable, "-m", "omnirl.cli", "run", str(job), "--out", str(out), "--no-ray",
                             "--device", "cpu", *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=ROOT)


def _finish(proc: subprocess.Popen, timeout_s: float) -> tuple[int, str]:
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the launcher stops its roles and Redis
        output, _ = proc.communicate(timeout=60)
        raise AssertionError(f"still running after {timeout_s} s (hung?):\n{output[-3000:]}") from None
    return proc.returncode, output


def _trained(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [r["step"] for r in map(json.loads, lines) if r["event"] == "step"]


def test_a_resume_with_another_group_size_is_refused_before_anything_starts(tmp_path):
    out = tmp_path / "out"
    first = _omnirl(_job(tmp_path), out)
    try:
        wait_until(lambda: first.poll() is not None or _trained(out), "the first step", timeout_s=120)
        time.sleep(0.3)  # into the next step: its requests are published, its samples on their way
    finally:
        first.send_signal(signal.SIGTERM)  # as Ctrl-C
    assert _finish(first, 90)[0] == 130
    trained, before = _trained(out), (out / "job.yaml").read_text()

    code, output = _finish(_omnirl(_job(tmp_path, groupSize=4), out, "--resume"), 60)
    lines = output.strip().splitlines()
    assert code == 2 and len(lines) == 1, output[-3000:]
    assert lines[0] == (
        f"omnirl run: --resume: {out} holds a run started with spec.algorithm.groupSize 3 (now 4): the steps it "
        "published and its data position were made with it, and a resumed controller would wait for samples never "
        "requested or train samples with settings they were not drawn with; put the earlier values back to resume "
        "it, or start a new run (another --out) with model.path: OUT/exports/latest to continue from its weights")
    assert (out / "job.yaml").read_text() == before and _trained(out) == trained

    # a new learning rate shapes nothing stored: the same check lets it through
    preflight.check_same_job(load_rljob(_job(tmp_path, optimizer={"learningRate": 5e-5, "microBatchSize": 6})), out)


def test_which_changes_a_resume_refuses(tmp_path):
    """The fields of `RESUME_FIXED` only, each with both values; a prompt path written relative (a manifest as
    typed, the operator's ConfigMap) matches the absolute one it ends; another algorithm's block is not compared."""
    base = dump_rljob(load_rljob(_job(tmp_path)))

    def edited(**changes) -> dict:
        doc = json.loads(json.dumps(base))
        for path, value in changes.items():
            *parents, leaf = path.split("__")
            node = doc
            for key in parents:
                node = node[key]
            node[leaf] = value
        return doc

    assert resume_changes(base, edited(spec__algorithm__optimizer__learningRate=5e-5, spec__algorithm__steps=9,
                                       spec__validation__everySteps=3)) == []
    assert resume_changes(base, edited(spec__algorithm__promptsPerStep=3, spec__seed=1,
                                       spec__algorithm__flowGrpo__noiseLevel=0.5)) == [
        ("spec.algorithm.promptsPerStep", 2, 3), ("spec.seed", 0, 1), ("spec.algorithm.flowGrpo.noiseLevel", 0.8, 0.5)]
    train = base["spec"]["data"]["trainPrompts"]
    assert resume_changes(edited(spec__data__trainPrompts="prompts/ocr-train.txt"), base) == []
    assert resume_changes(edited(spec__data__trainPrompts="./prompts/ocr-train.txt"), base) == []
    assert resume_changes(edited(spec__data__trainPrompts="other/ocr-train.txt"), base) == [
        ("spec.data.trainPrompts", "other/ocr-train.txt", train)]
    nft = edited(spec__algorithm__name="diffusion-nft")
    del nft["spec"]["algorithm"]["flowGrpo"]
    assert resume_changes(base, nft) == []  # the algorithm's name is check_same_job's


def _lora_job(tmp: Path, name: str, **lora) -> Path:
    doc = yaml.safe_load((ROOT / "examples" / "ocr-awm.yaml").read_text())
    doc["spec"]["data"] = {k: str(ROOT / "examples" / v) for k, v in doc["spec"]["data"].items()}
    if lora:
        doc["spec"]["model"]["lora"] = lora
    path = tmp / name
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_resume_that_switches_lora_is_refused_before_the_roles_load(tmp_path, capsys, monkeypatch):
    """A full-weight run resumed with `model.lora.enabled: true` (or a LoRA run with another rank): its
    checkpoint's tensors are not the new actor's. Before, `omnirl run --resume` started Redis and every role,
    and the actor exited 4 once loaded (`checkpoint tensors do not match the model: missing=[…lora_A…]`,
    "restore it, or start a fresh run in another --out"); now one line names the field, before anything starts."""
    from omnirl.cli import main
    from omnirl.launch import local

    def went_ahead(job):  # past every pre-flight check: Redis and the roles would start next
        raise RuntimeError("the resume went ahead")

    monkeypatch.setattr(local, "check_local", went_ahead)
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"event": "start"}) + "\n")
    (run / "job.yaml").write_text(yaml.safe_dump(dump_rljob(load_rljob(_lora_job(tmp_path, "full.yaml")))))
    lora = _lora_job(tmp_path, "lora.yaml", enabled=True, rank=4)
    assert main(["run", str(lora), "--resume", "--no-ray", "--out", str(run)]) == 2
    assert capsys.readouterr().err == (
        f"omnirl run: --resume: {run} holds a run with spec.model.lora.enabled False, not True; resume it with its "
        "own manifest, or start a new run (another --out) with model.path: OUT/exports/latest\n")
    assert not (run / "redis").exists() and not (run / "roles.json").exists()  # nothing started

    # a LoRA run: its rank shapes the adapters; alpha (a scale) and the other fields do not
    (run / "job.yaml").write_text(yaml.safe_dump(dump_rljob(load_rljob(lora))))
    with pytest.raises(ValueError, match=r"holds a run with spec\.model\.lora\.rank 4, not 8;"):
        preflight.check_same_job(load_rljob(_lora_job(tmp_path, "r8.yaml", enabled=True, rank=8)), run)
    with pytest.raises(ValueError, match=r"holds a run with spec\.model\.lora\.enabled True, not False;"):
        preflight.check_same_job(load_rljob(_lora_job(tmp_path, "off.yaml")), run)
    preflight.check_same_job(load_rljob(_lora_job(tmp_path, "a.yaml", enabled=True, rank=4, alpha=8.0)), run)
