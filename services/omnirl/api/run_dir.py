"""The run directory's `metrics.jsonl`: its name and its one reader.

The controller writes it (`controller/report.py::Reporter`); the launcher (`omnirl run --resume`,
the held-out table), the controller on restart and `omnirl export` (validations into the export's
manifest) read it here, so the file's name and line format have one owner below every layer that
uses them.
"""

from __future__ import annotations

import json
from pathlib import Path

METRICS_FILE = "metrics.jsonl"
"""One JSON record per line in the run directory: `{"event": "step" | "validation" | ..., "step": k, ...}`."""


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
