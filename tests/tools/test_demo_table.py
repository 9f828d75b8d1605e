"""tools/demo_table.py: held-out reward at fixed wall-clock times from a run's metrics.jsonl."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("demo_table", Path(__file__).parents[2] / "tools" / "demo_table.py")
demo_table = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(demo_table)


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"event": "start", "time": 1000.0, "total_steps": 40, "start_step": 0}]
    for step, dt, reward in ((0, 100.0, 0.45), (20, 400.0, 0.70), (40, 700.0, 0.90)):
        rows.append({"event": "step", "step": step, "time": 1000.0 + dt - 1, "reward_mean": 0.5})
        rows.append({"event": "validation", "time": 1000.0 + dt, "step": step, "val_reward_mean": reward,
                     "val_exact_match": reward / 2, "val_background_darkness": 0.05})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "job.yaml").write_text("metadata:\n  name: ocr-awm\nspec:\n  algorithm:\n    name: awm\n")
    return run


def test_reward_at_takes_the_last_validation_finished_in_time(tmp_path):
    start, vals = demo_table.read_run(_run(tmp_path))
    assert start == 1000.0 and [v["step"] for v in vals] == [0, 20, 40]
    assert [demo_table.reward_at(start, vals, m)["step"] for m in (5, 10, 15)] == [0, 20, 40]
    assert demo_table.reward_at(start, vals, 1.0) is None  # nothing validated in the first minute
    # 250 s of launch before the controller's start: step 0 at 350 s, step 20 at 650 s, step 40 at 950 s
    assert demo_table.reward_at(start, vals, 5, launch_delay=250.0) is None
    assert [demo_table.reward_at(start, vals, m, launch_delay=250.0)["step"] for m in (10, 15)] == [0, 20]


def test_table_rows_and_errors(tmp_path, capsys):
    run = _run(tmp_path)
    table = demo_table.wall_clock_table([run], [5, 10, 15])
    assert "ocr-awm (awm)" in table
    assert "0.450 (step 0, dark 0.050) | 0.700 (step 20, dark 0.050) | 0.900 (step 40, dark 0.050)" in table
    assert "0.900 at step 40, 11.7 min" in table
    assert demo_table.main([str(tmp_path / "missing")]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
    (run / "metrics.jsonl").write_text(json.dumps({"event": "validation", "time": 1.0}) + "\n")
    with pytest.raises(ValueError, match="no 'start' record"):
        demo_table.read_run(run)
