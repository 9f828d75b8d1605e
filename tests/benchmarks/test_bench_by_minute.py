"""benchmarks/by_minute.py: the held-out reward and each term at 5 / 10 / 15 minutes from a run's metrics.jsonl,
the docs table rendered from result JSONs ("not measured yet" for an algorithm with none), and docs/omni.md
holding the table the committed results render to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks import by_minute

from omnirl.api.loader import load_rljob

ROOT = Path(__file__).resolve().parents[2]
TERMS = ["ocr", "beeps", "pitch", "sync"]


def _records(start: float = 1000.0) -> list[dict]:
    """A run: validations at 1, 4.5, 9 and 16 min (steps 0, 10, 20, 30); steps every 27 s."""
    rows = [{"event": "start", "time": start, "total_steps": 60, "start_step": 0}]
    rows += [{"event": "step", "step": k, "time": start + 30.0 + 27.0 * k} for k in range(31)]
    for step, minute, terms in ((0, 1.0, (0.88, 0.48, 0.55, 0.15)), (10, 4.5, (0.89, 0.70, 0.98, 0.37)),
                                (20, 9.0, (0.89, 0.75, 1.0, 0.40)), (30, 16.0, (0.91, 0.76, 1.0, 0.44))):
        rows.append({"event": "validation", "time": start + 60.0 * minute, "step": step,
                     "val_reward_mean": sum(terms) / 4, **{f"val_reward_{t}": v for t, v in zip(TERMS, terms, strict=True)}})
    return rows


def test_each_mark_is_the_last_validation_finished_by_then_with_every_term():
    s = by_minute.summarize(_records(), TERMS, [0.5, 5, 10, 15])
    assert [m["step"] for m in s["marks"]] == [None, 10, 20, 20]  # 16 min is past the 15-minute mark
    five = s["marks"][1]
    assert five["at_minutes"] == 4.5 and five["reward"] == round((0.89 + 0.70 + 0.98 + 0.37) / 4, 4)
    assert five["terms"] == {"ocr": 0.89, "beeps": 0.70, "pitch": 0.98, "sync": 0.37}
    assert [v["step"] for v in s["validations"]] == [0, 10, 20, 30]
    assert s["steps_done"] == 31 and s["seconds_per_step_median"] == 27.0
    with pytest.raises(ValueError, match="no 'start' record"):
        by_minute.summarize([r for r in _records() if r["event"] != "start"], TERMS)


def _result(algorithm: str, *, smoke: bool = False) -> dict:
    return {"algorithm": algorithm, "manifest": by_minute.EXAMPLES[algorithm], "date": "2026-12-07", "smoke": smoke,
            "commit": "0123456789", "dirty": False, "cores": [2, 3], "machine_cpus": 16, "cpu_model": "X",
            "loadavg_start": [1.0], "loadavg_end": [2.5], "steps_done": 31, "seconds_per_step_median": 27.0,
            "validation_prompts": 64, "validate_every": 10, "launch_seconds": 12.0,
            **by_minute.summarize(_records(), TERMS)}


def test_the_table_shows_measured_algorithms_and_says_not_measured_yet_for_the_others():
    table = by_minute.render_table([_result("awm"), _result("dgpo", smoke=True)])
    lines = table.splitlines()
    assert lines[0] == "| algorithm (manifest) | minutes | step | held-out sum | ocr | beeps | pitch | sync |"
    for label in ("FlowGRPO", "DiffusionNFT", "DGPO"):  # DGPO's only result is a smoke run: not shown
        row = next(line for line in lines if line.startswith(f"| {label} "))
        assert "| 5 / 10 / 15 | not measured yet | not measured yet |" in row
    awm = lines[lines.index(next(line for line in lines if line.startswith("| AWM "))):][:4]
    assert awm[0].endswith("| base | 0 (at 1.0 min) | 0.515 | 0.880 | 0.480 | 0.550 | 0.150 |")
    assert awm[1] == "|  | 5 | 10 (at 4.5 min) | 0.735 | 0.890 | 0.700 | 0.980 | 0.370 |"
    assert awm[3] == "|  | 15 | 20 (at 9.0 min) | 0.760 | 0.890 | 0.750 | 1.000 | 0.400 |"
    assert "- AWM: 2026-12-07, commit 0123456, cores 2,3 of 16 (X), load 1 → 2.5, 31 steps" in table
    assert "not measured yet" not in by_minute.render_table([_result(a) for a in by_minute.ALGORITHMS])


def test_write_docs_replaces_only_between_the_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"before\n{by_minute.BEGIN}\nold\n{by_minute.END}\nafter\n")
    assert by_minute.write_docs(page, "| t |") is True
    assert page.read_text() == f"before\n{by_minute.BEGIN}\n| t |\n{by_minute.END}\nafter\n"
    assert by_minute.write_docs(page, "| t |") is False
    page.write_text("no markers\n")
    with pytest.raises(ValueError, match="markers"):
        by_minute.write_docs(page, "| t |")


def test_docs_omni_holds_the_table_of_the_committed_results():
    """`python -m benchmarks.by_minute table --write docs/omni.md` after adding a result; no invented numbers."""
    text = (ROOT / "docs" / "omni.md").read_text()
    inside = text.split(by_minute.BEGIN, 1)[1].split(by_minute.END, 1)[0].strip()
    results = [json.loads(p.read_text()) for p in by_minute.committed_results()]
    assert inside == by_minute.render_table(results), "stale: python -m benchmarks.by_minute table --write docs/omni.md"


@pytest.mark.parametrize("example", sorted(set(by_minute.EXAMPLES.values())))
def test_the_smoke_manifest_is_a_valid_shrunk_job(example, tmp_path):
    path = by_minute.effective_manifest(ROOT / example, tmp_path / "run", validate_every=None, smoke=True)
    job = load_rljob(path)
    assert (job.spec.algorithm.steps, job.spec.algorithm.groupSize, job.spec.validation.maxPrompts) == (2, 4, 4)
    assert Path(job.spec.data.trainPrompts).is_absolute() and Path(job.spec.data.trainPrompts).is_file()
    full = load_rljob(by_minute.effective_manifest(ROOT / example, tmp_path / "full", validate_every=5, smoke=False))
    assert full.spec.validation.everySteps == 5 and full.spec.algorithm.steps == load_rljob(ROOT / example).spec.algorithm.steps
