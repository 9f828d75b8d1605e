"""What `async-reward` hides when the judge is slow: step time of a small CPU job whose only reward
is a judge server the job starts itself (`reward[].server`: `omnirl scorer serve --delay-ms`, JPEG
compressibility plus a sleep per sample, requests served one at a time), in `sync`,
`async-reward` and `fully-async`.

The judge's delay per sample is set equal to the rollout's time per sample, measured first on a
`sync` run with an instant judge (`rollout_seconds / samples`, steps after the first). The first
step of every run (start-up) is left out of the means. The step time compared is the wall clock
between consecutive step ends (`time` in metrics.jsonl): in `fully-async` a step's own
`step_seconds` starts when its requests go out, during the previous step's training. `rollout s`
and `scored s` are seconds from a step's requests to its last sample generated / scored;
`roles.rollout.maxBatchSize` (default 2) makes samples finish in waves, as a busy rollout
worker's do, so a streaming judge can overlap the rest of the rollout. Every role runs with
`--threads` torch threads (default 1, `OMNIRL_LOCAL_THREADS`): on a shared 2-core machine the
launcher's default of every core per role made OpenMP threads spin against other processes and
dominated the step time (training 14 s per step with 2 threads, 0.7 s with 1).

    python -m benchmarks.slow_judge [examples/ocr-flowgrpo.yaml] [--steps 4] [--prompts 2] [--group 4]
        [--num-steps 4] [--delay-ms D]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

import yaml

from omnirl.api.loader import dump_rljob, load_rljob

MODES = ("sync", "async-reward", "fully-async")


def run_mode(job_path: str, mode: str, delay_ms: float, steps: int, work: Path, shape: dict, threads: int
             ) -> list[dict]:
    """Run the job in `mode` with the judge sleeping `delay_ms` per sample; returns its step records."""
    env = {**os.environ, "OMNIRL_LOCAL_THREADS": str(threads)} if threads else None
    doc = dump_rljob(load_rljob(job_path))
    doc["metadata"]["name"] = f"judge-{mode}-{int(delay_ms)}"
    spec = doc["spec"]
    spec["pipeline"]["mode"] = mode
    spec["data"]["validationPrompts"] = None
    spec["checkpoint"]["everySteps"] = 0
    algo = spec["algorithm"]
    algo.update(promptsPerStep=shape["promptsPerStep"], groupSize=shape["groupSize"])
    algo["sampling"]["numSteps"] = shape["numSteps"]  # the e2e tests' tiny job: 4 steps, window of 2
    algo["flowGrpo"]["window"] = {"size": 2, "range": [0, shape["numSteps"] - 1]}
    algo["optimizer"].update(microBatchSize=8, updatesPerStep=1)
    spec["roles"]["reward"]["batchSize"] = 4
    # samples finish in waves of maxBatchSize, so a streaming judge has something to overlap with
    spec["roles"]["rollout"]["maxBatchSize"] = shape["maxBatchSize"]
    spec["reward"] = [{"name": "judge", "kind": "http", "timeoutSeconds": 300, "server": {
        "command": [sys.executable, "-m", "omnirl.cli", "scorer", "serve", "--reward", "jpeg", "--protocol", "http",
                    "--port", "{port}", "--host", "127.0.0.1", "--delay-ms", str(delay_ms)],
        "urlPath": "/v1/score", "healthPath": "/healthz"}}]
    manifest = work / f"{mode}-{int(delay_ms)}.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    out = work / f"out-{mode}-{int(delay_ms)}"
    proc = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", str(manifest), "--steps", str(steps),
                           "--out", str(out), "--no-ray"], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps_ = [r for r in rows if r.get("event") == "step"]
    for prev, r in zip(steps_, steps_[1:], strict=False):  # wall clock between step ends: comparable across modes
        r["wall_seconds"] = r["time"] - prev["time"]
    return steps_[1:]


def mean(rows: list[dict], key: str) -> float:
    """Mean of `key` over the step records."""
    return statistics.fmean(r[key] for r in rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("job", nargs="?", default="examples/ocr-flowgrpo.yaml")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompts", type=int, default=2, help="promptsPerStep")
    p.add_argument("--group", type=int, default=4, help="groupSize")
    p.add_argument("--num-steps", type=int, default=4, help="denoising steps per sample")
    p.add_argument("--max-batch", type=int, default=2, help="roles.rollout.maxBatchSize")
    p.add_argument("--threads", type=int, default=1, help="torch threads of every role (0: the launcher's "
                   "default, which gives each role every core outside fully-async)")
    p.add_argument("--delay-ms", type=float, default=None, help="judge delay per sample; default: measured")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args()
    shape = {"promptsPerStep": args.prompts, "groupSize": args.group, "numSteps": args.num_steps, "maxBatchSize": args.max_batch}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        delay = args.delay_ms
        if delay is None:
            calib = run_mode(args.job, "sync", 0.0, 3, work, shape, args.threads)
            delay = 1000.0 * mean(calib, "rollout_seconds") / mean(calib, "samples")
            print(f"rollout time per sample (sync, instant judge): {delay:.0f} ms -> judge delay {delay:.0f} ms/sample",
                  flush=True)
        rows = []
        for mode in MODES:
            steps = run_mode(args.job, mode, delay, args.steps, work, shape, args.threads)
            rows.append({"mode": mode, "wall_seconds": mean(steps, "wall_seconds"),
                         "step_seconds": mean(steps, "step_seconds"), "train_seconds": mean(steps, "train_seconds"),
                         "rollout_seconds": mean(steps, "rollout_seconds"),
                         "reward_seconds": mean(steps, "reward_seconds"),
                         "images_per_second": mean(steps, "images_per_second"), "steps_measured": len(steps)})
    base = rows[0]["wall_seconds"]
    print(f"{'mode':13} {'wall s/step':>11} {'rollout s':>9} {'scored s':>9} {'train s':>8} {'saved vs sync':>14}")
    for r in rows:
        print(f"{r['mode']:13} {r['wall_seconds']:11.2f} {r['rollout_seconds']:9.2f} {r['reward_seconds']:9.2f} "
              f"{r['train_seconds']:8.2f} {100 * (1 - r['wall_seconds'] / base):13.1f}%")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{date.today()}-cpu-slow-judge-{args.prompts * args.group}-samples.json"
    path.write_text(json.dumps({"job": args.job, "steps": args.steps, "shape": shape, "judge_delay_ms": delay,
                                "threads": args.threads,
                                "rows": rows}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
