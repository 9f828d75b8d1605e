"""benchmarks/gpu/logprob_mismatch.py on its CPU path: a tiny SD3, fp32, with and without CFG.

In fp32 on the CPU the actor's recomputed log-probs equal the rollout's exactly when the batches
match, and to fp32 rounding when the step-wise engine mixed batch companions (the bf16 numbers
come from the GPU run of the same code).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("diffusers")

from benchmarks.gpu.logprob_mismatch import main  # noqa: E402


def test_cpu_fp32_mismatch_is_at_rounding_per_step_with_and_without_cfg(tmp_path, capsys):
    out = tmp_path / "mismatch.json"
    report = main(["--tiny", "--dtype", "float32", "--cfg", "1.0,4.5", "--layouts", "stepwise,matched",
                   "--requests", "5", "--num-steps", "3", "--resolution", "32", "--rollout-batch", "2",
                   "--micro-batch", "3", "--out", str(out)])
    assert json.loads(out.read_text()) == report == json.loads(capsys.readouterr().out)
    assert [(r["cfg"], r["layout"]) for r in report["runs"]] == [
        (1.0, "stepwise"), (1.0, "matched"), (4.5, "stepwise"), (4.5, "matched")]
    for run in report["runs"]:
        assert run["steps"] == [0, 1] and len(run["per_step_mean_abs"]) == 2
        # matched: the same batch shapes, so the same kernels: exactly equal. stepwise: fp32 GEMMs
        # blocked by batch size round differently on some CPUs (1.9e-6 seen on an AMD EPYC)
        bound = 0.0 if run["layout"] == "matched" else 1e-5
        assert run["max_abs"] <= bound and max(run["per_step_mean_abs"]) <= bound, run


def test_bad_layout_is_refused():
    with pytest.raises(SystemExit):
        main(["--tiny", "--layouts", "fancy"])


def test_fused_gelu_rollout_is_reported_and_the_cpu_fallback_changes_nothing():
    """`--fused-gelu` fuses the rollout's 5 TINY feed-forward GELUs; off CUDA the op computes the
    unfused formula, so the mismatch stays at fp32 zero (on the H200 it does not: benchmarks/README)."""
    report = main(["--tiny", "--dtype", "float32", "--cfg", "1.0", "--layouts", "matched", "--requests", "2",
                   "--num-steps", "2", "--resolution", "32", "--micro-batch", "2", "--fused-gelu"])
    (run,) = report["runs"]
    assert run["rollout_fused_gelus"] == 5 and run["max_abs"] == 0.0
