"""The demo's held-out reward by wall clock, from the runs' own `metrics.jsonl` timestamps.

    python tools/demo_table.py runs/demo runs/demo-nft runs/demo-flowgrpo            # the README table
    python tools/demo_table.py runs/demo --by-step                                    # every validation

For each run directory (`omnirl run … --out DIR`) it prints, as a Markdown table, the held-out mean
reward of the last validation finished by 5, 10 and 15 minutes (`--minutes`), with its step, and
that validation's background darkness (`val_background_darkness`: 0 = white border rows). The clock
starts at the controller's `start` record, a few seconds after `omnirl run` was typed (process and
Ray start-up); `--launch-delay S` adds S seconds to every time when you measured that gap.
Standard library only: it runs without the omnirl environment.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def read_run(run_dir: Path) -> tuple[float, list[dict]]:
    """(controller start time in unix seconds, validation records in file order) of one run.

    Raises:
        FileNotFoundError: no `metrics.jsonl` in `run_dir` (not a run directory).
        ValueError: the file has no `start` record (a truncated or foreign file).
    """
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics.jsonl — pass the --out directory of an `omnirl run`")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    starts = [r["time"] for r in records if r.get("event") == "start"]
    if not starts:
        raise ValueError(f"{path}: no 'start' record, so no clock origin; is the run complete?")
    # a round whose every sample was missing (tensors expired) has no mean to show
    return starts[0], [r for r in records if r.get("event") == "validation" and r.get("val_reward_mean") is not None]


def reward_at(start: float, validations: list[dict], minutes: float, launch_delay: float = 0.0) -> dict | None:
    """The last validation finished within `minutes` of the start (+ `launch_delay` s), or None."""
    done = [v for v in validations if v["time"] - start + launch_delay <= minutes * 60.0]
    return done[-1] if done else None


def _job_label(run_dir: Path) -> str:
    job = run_dir / "job.yaml"
    name = algo = "?"
    if job.is_file():  # a plain scan keeps this tool free of a YAML dependency
        for line in job.read_text().splitlines():
            s = line.strip()
            if s.startswith("name:") and name == "?":
                name = s.split(":", 1)[1].strip()
            elif s.startswith("name:") and algo == "?" and line.startswith("    name:"):
                algo = s.split(":", 1)[1].strip()
    return f"{name} ({algo})"


def wall_clock_table(run_dirs: list[Path], minutes: list[float], launch_delay: float = 0.0) -> str:
    """Markdown: one row per run, held-out reward (step, darkness) at each of `minutes`."""
    head = "| run | " + " | ".join(f"{m:g} min" for m in minutes) + " | last validation |"
    rows = [head, "|" + " --- |" * (len(minutes) + 2)]
    for d in run_dirs:
        start, vals = read_run(d)
        cells = []
        for m in minutes:
            v = reward_at(start, vals, m, launch_delay)
            cells.append("—" if v is None else
                         f"{v['val_reward_mean']:.3f} (step {v['step']}, dark {v['val_background_darkness']:.3f})")
        last = vals[-1] if vals else None
        tail = "—" if last is None else (f"{last['val_reward_mean']:.3f} at step {last['step']}, "
                                         f"{(last['time'] - start + launch_delay) / 60:.1f} min")
        rows.append(f"| {d} {_job_label(d)} | " + " | ".join(cells) + f" | {tail} |")
    return "\n".join(rows)


def by_step_table(run_dir: Path, launch_delay: float = 0.0) -> str:
    """Markdown: every validation of one run — step, minutes, reward, exact match, darkness."""
    start, vals = read_run(run_dir)
    rows = [f"{run_dir} {_job_label(run_dir)}", "| step | minutes | held-out reward | exact match | background |",
            "| --- | --- | --- | --- | --- |"]
    for v in vals:
        rows.append(f"| {v['step']} | {(v['time'] - start + launch_delay) / 60:.2f} | {v['val_reward_mean']:.3f} | "
                    f"{'—' if v['val_exact_match'] is None else format(v['val_exact_match'], '.3f')} | "
                    f"{v['val_background_darkness']:.3f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories (omnirl run --out)")
    p.add_argument("--minutes", type=float, nargs="+", default=[5.0, 10.0, 15.0])
    p.add_argument("--launch-delay", type=float, default=0.0, help="seconds from `omnirl run` to the controller start")
    p.add_argument("--by-step", action="store_true", help="also print every validation of each run")
    args = p.parse_args(argv)
    try:
        print(wall_clock_table(args.runs, args.minutes, args.launch_delay))
        if args.by_step:
            for d in args.runs:
                print()
                print(by_step_table(d, args.launch_delay))
    except (FileNotFoundError, ValueError) as err:
        print(f"demo_table: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
