"""The run directory's `metrics.jsonl`: its name, its one reader and what it says of the run.

The controller writes it (`controller/report.py::Reporter`); the launcher (`omnirl run --resume`,
the held-out table), the controller on restart, `omnirl export` (validations into the export's
manifest) and `omnirl ledger` (the planned steps) read it here, so the file's name and line format have
one owner below every layer that uses them. Which steps a run trained (`trained_steps`) and whether it
finished (`finished`; of a `finish` record: `finish_covers`) are answered here once, for every reader.
Also where a run directory keeps its manifest (`run_manifest`: `omnirl export`, `omnirl ledger`).
"""

from __future__ import annotations

import json
from pathlib import Path

METRICS_FILE = "metrics.jsonl"
"""One JSON record per line in the run directory: `{"event": "step" | "validation" | ..., "step": k, ...}`."""
RUN_MANIFESTS = ("job.yaml", "exports/latest/job.yaml")
"""Where a run directory holds the manifest its run used, first found first: `omnirl run`'s copy, else the last
export's (a Kubernetes run's controller writes only that one)."""


def run_manifest(run_dir: Path) -> Path | None:
    """The manifest `run_dir` holds (`RUN_MANIFESTS`), or None."""
    return next((Path(run_dir) / m for m in RUN_MANIFESTS if (Path(run_dir) / m).is_file()), None)


def train_reward(step_record: dict) -> float:
    """A step's train reward as a user reads it (console line, bar, closing table, `status.rewardMean`,
    `omnirl_reward_mean{reward="total"}`): the raw weighted sum (`raw_reward_mean`) in a job that normalises
    a reward, whose trained mean (`reward_mean`) is the same every step (0 + 0.5·0 + 0.1·½ = 0.050 for
    group- and batch-normalised rewards beside a pairwise one), else `reward_mean`.

    Args:
        step_record: a step's `metrics.jsonl` line (or the controller's step stats): `reward_mean` (float)
            and, in a normalised job, `raw_reward_mean` (float).
    Raises:
        KeyError: the record has neither a non-None `raw_reward_mean` nor a `reward_mean`.
    """
    raw = step_record.get("raw_reward_mean")
    return step_record["reward_mean"] if raw is None else raw


def train_reward_std(step_record: dict) -> float:
    """The spread that goes with `train_reward` (the console line's `±`, `omnirl_reward_std`): the population
    standard deviation of the step's raw weighted sums (`raw_reward_std`) in a job that normalises a reward,
    whose trained rewards' spread (`reward_std`) is about 1 by construction (z-scores), else `reward_std`.

    Args:
        step_record: a step's `metrics.jsonl` line (or the controller's step stats): `reward_std` (float) and,
            in a normalised job, `raw_reward_mean` and `raw_reward_std` (float).
    Raises:
        KeyError: a normalised record (non-None `raw_reward_mean`) without `raw_reward_std` (a line written
            before 2026-12-03), or a record without `reward_std`.
    """
    if step_record.get("raw_reward_mean") is not None:
        return step_record["raw_reward_std"]
    return step_record["reward_std"]


def read_metrics(run_dir: Path) -> list[dict]:
    """Every record of `run_dir/metrics.jsonl`, in the order written (blank lines skipped, and a last
    line without its newline: one being appended now, or cut short by a full disk).

    Raises:
        FileNotFoundError: `run_dir` holds no `metrics.jsonl`.
        json.JSONDecodeError: a line that is not JSON.
    """
    text = (Path(run_dir) / METRICS_FILE).read_text()
    whole = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in whole.splitlines() if line.strip()]


def trained_steps(run_dir: Path) -> set[int]:
    """The training steps (0-based) with a line in `run_dir/metrics.jsonl`: the steps whose result a controller has
    recorded. The one reader of that fact: the controller (`Reporter.has_step`, before it writes a line again) and
    `omnirl run` (how far a run got: its highest step + 1, before a `--resume` starts anything).

    Raises:
        FileNotFoundError: `run_dir` holds no `metrics.jsonl`.
    """
    return {int(rec["step"]) for rec in read_metrics(run_dir) if rec.get("event") == "step"}


def finished(run_dir: Path, since: int = 0) -> bool:
    """True when the last controller to start in `run_dir` also finished (its final validation and
    export written): a run stopped after training its last step, before that, is not finished.
    `since`: only the records after the first `since` count (a launcher asks about the controllers it
    started: a resumed run whose earlier part finished has not finished while no new record says so).

    Raises:
        FileNotFoundError: `run_dir` holds no `metrics.jsonl`.
    """
    ends = [rec["event"] for rec in read_metrics(run_dir)[since:] if rec.get("event") in ("start", "finish")]
    return bool(ends) and ends[-1] == "finish"


def finish_covers(record: dict | None, total: int) -> bool:
    """Whether `record`, a `finish` record (the line of `metrics.jsonl`, or the copy in Redis,
    `transfer/records.py::FINISHED`), says the job's `total` steps are done: its `total_steps` ≥ `total`. A run
    resumed for more steps than it finished is not done. False for None. The progress bar, `omnirl role` at
    start-up and the operator ask it."""
    return record is not None and int(record.get("total_steps") or 0) >= total


def term_means(summary: dict) -> dict[str, float]:
    """Each per-sample reward's held-out mean of a `validation` record (`val_reward_<name>`), by name, in the
    record's order; the sum (`val_reward_mean`) and absent means are left out."""
    return {k.removeprefix("val_reward_"): v for k, v in summary.items()
            if k.startswith("val_reward_") and k != "val_reward_mean" and v is not None}
