"""The result of a real run, as its users load it: `omnirl run` exports every checkpoint to
`OUT/exports/`, and the built-in model's export, loaded back with the digits adapter, scores the
held-out reward the run's last validation reported (same prompts, same noise seeds)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from e2e.test_local_job import ROOT, run, tiny_job
from safetensors.torch import load_file

from omnirl.api.loader import load_rljob
from omnirl.controller.data import read_prompts
from omnirl.evaluation.evaluate import evaluate
from omnirl.models.digits.adapter import load_digits_adapter


@pytest.mark.slow
def test_the_run_exports_its_result_and_it_scores_the_last_validation(tmp_path, redis_url):
    job_path = tiny_job(tmp_path, "export", redis_url, steps=2)
    out = tmp_path / "out"
    proc = run(job_path, out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    latest = out / "exports" / "latest"
    assert latest.resolve() == out / "exports" / "step-000001"  # the only checkpoint (the last step)
    manifest = json.loads((latest / "export.json").read_text())
    assert (manifest["step"], manifest["policy_version"], manifest["weights"], manifest["family"]) == \
        (1, 2, "full", "ocr-digits")
    assert manifest["files"] == ["config.json", "job.yaml", "model.safetensors", "validation.json"]
    validation = json.loads((latest / "validation.json").read_text())
    last = validation["validation"]
    assert (last["step"], last["policy_version"], last["n"]) == (2, 2, 4)
    assert [v["step"] for v in validation["history"]] == [0, 2]
    # the exported weights are the checkpoint's policy, bit for bit
    policy = load_file(out / "checkpoints" / "latest" / "policy.safetensors")
    exported = load_file(latest / "model.safetensors")
    assert policy.keys() == exported.keys() and all(policy[k].equal(exported[k]) for k in policy)

    job = load_rljob(latest / "job.yaml")
    adapter = load_digits_adapter(latest)
    v = job.spec.validation
    prompts = read_prompts(job.spec.data.validationPrompts)[: v.maxPrompts]
    result = evaluate(adapter, job.spec, prompts)
    assert result.mean_reward == pytest.approx(last["val_reward_mean"], abs=1e-6)
    assert result.exact_match == pytest.approx(last["val_exact_match"], abs=1e-6)

    # `omnirl export` of the same checkpoint writes the same result
    cli = subprocess.run([sys.executable, "-m", "omnirl.cli", "export", str(out), "--out", str(tmp_path / "again")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert cli.returncode == 0, cli.stderr
    again = load_file(tmp_path / "again" / "model.safetensors")
    assert all(again[k].equal(exported[k]) for k in exported)
    assert json.loads((tmp_path / "again" / "validation.json").read_text()) == validation
