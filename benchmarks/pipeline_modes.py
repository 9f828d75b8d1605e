"""Step time and images/s of a real local job under each pipelining mode and rollout correction.

Runs `omnirl run` (all roles as processes, real Redis, real weight sync) for a few steps per
configuration, without validation, and reads `metrics.jsonl`. The first step (start-up) is left
out of the means.

    python -m benchmarks.pipeline_modes [examples/ocr-flowgrpo.yaml] [--steps 6]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

import yaml

from omnirl.api.loader import dump_rljob, load_rljob

CONFIGS = [
    ("sync", "recompute"),
    ("async-reward", "recompute"),
    ("fully-async", "recompute"),
    ("async-reward", "bypass"),
    ("fully-async", "bypass"),
]


def run_config(job_path: str, mode: str, correction: str, steps: int, work: Path) -> dict:
    """Run one configuration; returns its mean step seconds, images/s and phase times."""
    doc = dump_rljob(load_rljob(job_path))
    doc["metadata"]["name"] = f"bench-{mode}-{correction}"
    doc["spec"]["pipeline"]["mode"] = mode
    doc["spec"]["algorithm"]["flowGrpo"]["rolloutCorrection"]["mode"] = correction
    doc["spec"]["data"]["validationPrompts"] = None
    doc["spec"]["checkpoint"]["everySteps"] = 0
    manifest = work / f"{mode}-{correction}.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    out = work / f"out-{mode}-{correction}"
    proc = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", str(manifest), "--steps", str(steps),
                           "--out", str(out), "--no-ray"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode}/{correction} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps_ = [r for r in rows if r.get("event") == "step"][1:]
    mean = lambda key: statistics.fmean(r[key] for r in steps_)  # noqa: E731
    return {"mode": mode, "correction": correction, "step_seconds": mean("step_seconds"),
            "images_per_second": mean("images_per_second"), "train_seconds": mean("train_seconds"),
            "sync_seconds": mean("sync_seconds"), "rollout_seconds": mean("rollout_seconds"),
            "reward_seconds": mean("reward_seconds"), "steps_measured": len(steps_)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("job", nargs="?", default="examples/ocr-flowgrpo.yaml")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--only", default=None, help="run only the modes containing this text, e.g. fully-async")
    args = p.parse_args()
    configs = [(m, c) for m, c in CONFIGS if args.only is None or args.only in m]
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run_config(args.job, m, c, args.steps, Path(tmp)) for m, c in configs]
    base = rows[0]["step_seconds"]
    print(f"{'mode':13} {'old log-prob':12} {'step s':>7} {'images/s':>9} {'train s':>8} {'sync s':>7} {'vs sync':>8}")
    for r in rows:
        print(f"{r['mode']:13} {r['correction']:12} {r['step_seconds']:7.2f} {r['images_per_second']:9.2f} "
              f"{r['train_seconds']:8.2f} {r['sync_seconds']:7.3f} {base / r['step_seconds']:7.2f}x")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{date.today()}-cpu-pipeline-modes{'-' + args.only if args.only else ''}.json"
    path.write_text(json.dumps({"job": args.job, "steps": args.steps, "rows": rows}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
