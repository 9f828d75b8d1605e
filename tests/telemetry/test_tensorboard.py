"""`spec.telemetry.tensorboard`: the controller's reporter writes every number of each `metrics.jsonl` step and
validation line into `OUT/tensorboard/` (`telemetry/tensorboard.py`); read back with TensorBoard's own reader,
the values are those of `metrics.jsonl`. A whole run's: e2e/test_python_reward_job.py."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from omnirl.api.loader import load_rljob
from omnirl.api.messages import TrainDone
from omnirl.api.run_dir import read_metrics
from omnirl.api.runtime import RoleEnv
from omnirl.controller.report import Reporter
from omnirl.telemetry.tensorboard import SKIPPED, TENSORBOARD_DIR

ROOT = Path(__file__).resolve().parents[2]


def logged_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Tag → [(step, value)] of every scalar in `run_dir/tensorboard/`, as TensorBoard reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / TENSORBOARD_DIR), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def metrics_as_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """The same from `run_dir/metrics.jsonl`: each finite number of a step line as `train/<key>`, of a validation
    line as `validation/<key>`, at the line's `step`, as float32 (TensorBoard's scalar)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in read_metrics(run_dir):
        prefix = {"step": "train", "validation": "validation"}.get(r["event"])
        if prefix is None:
            continue
        for key, value in r.items():
            if key not in SKIPPED and not isinstance(value, bool) and isinstance(value, (int, float)) \
                    and math.isfinite(value):
                out.setdefault(f"{prefix}/{key}", []).append((r["step"], float(np.float32(value))))
    return out


def assert_tensorboard_is_metrics_jsonl(run_dir: Path) -> None:
    """Every scalar of the event files is a number of metrics.jsonl at its step, and every number is logged."""
    got, want = logged_scalars(run_dir), metrics_as_scalars(run_dir)
    assert want and got == want


def test_the_event_files_hold_the_numbers_of_metrics_jsonl(tmp_path: Path) -> None:
    job = load_rljob(str(ROOT / "examples" / "ocr-nft.yaml"))
    job.spec.telemetry.tensorboard = True
    reporter = Reporter(tmp_path, RoleEnv(job_name="j", redis_url="redis://127.0.0.1:1/0", weight_sync_host="127.0.0.1",
                                             weight_sync_port=1, worker_id="controller-0", out_dir=str(tmp_path)), job)
    try:
        reporter.started(3, 0)
        for step in range(3):
            stats = {"reward_mean": 0.1 * step + 0.05, "reward_std": 0.25, "samples": 64, "step_seconds": 2.0 + step,
                     "reward_ocr": 0.3 + step / 7, "dropped_groups": step, "kl": float("nan")}  # NaN: not logged
            reporter.step(step, step + 1, stats, TrainDone(step=step, policy_version=step + 1,
                                                           metrics={"loss": 1.0 / (step + 3), "grad_norm": 0.5}))
        reporter.validation({"step": 3, "policy_version": 3, "val_reward_mean": 0.625, "val_exact_match": None,
                             "n": 4, "val_seconds": 1.5, "grid": "g.png"})
    finally:
        reporter.close()
    got = logged_scalars(tmp_path)
    assert got["train/loss"] == [(s, float(np.float32(1.0 / (s + 3)))) for s in range(3)]
    assert got["validation/val_reward_mean"] == [(3, 0.625)] and "train/kl" not in got
    assert "train/images_per_second" in got  # the reporter's own numbers too: the line as written
    assert_tensorboard_is_metrics_jsonl(tmp_path)


def test_a_job_without_it_writes_no_event_files(tmp_path: Path) -> None:
    job = load_rljob(str(ROOT / "examples" / "ocr-nft.yaml"))
    assert job.spec.telemetry.tensorboard is False
    reporter = Reporter(tmp_path, RoleEnv(job_name="j", redis_url="redis://127.0.0.1:1/0", weight_sync_host="127.0.0.1",
                                             weight_sync_port=1, worker_id="controller-0", out_dir=str(tmp_path)), job)
    reporter.step(0, 1, {"reward_mean": 0.5, "reward_std": 0.1, "samples": 8}, TrainDone(step=0, policy_version=1,
                                                                                       metrics={}))
    reporter.close()
    assert not (tmp_path / TENSORBOARD_DIR).exists()


def test_run_refuses_it_without_the_tensorboard_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from omnirl.telemetry.tensorboard import require_tensorboard

    monkeypatch.setitem(__import__("sys").modules, "tensorboard", None)  # as if not installed
    with pytest.raises(ValueError) as err:
        require_tensorboard()
    assert str(err.value).startswith("spec.telemetry.tensorboard: true needs the tensorboard package, which is not "
                                     "installed here") and "pip install 'omnirl[tensorboard]'" in str(err.value)
