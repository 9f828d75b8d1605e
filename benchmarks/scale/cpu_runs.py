"""Measure the CPU job the simulation is checked against: `omnirl run` of the built-in digits job
with 1, 2 and 4 rollout replicas and 1 or 2 actor ranks, each role's CPU time by /proc.

Run: ``python -m benchmarks.scale.cpu_runs [--configs 1x1,2x1,4x1,1x2,2x2,4x2] [--steps 5]``
→ ``benchmarks/results/<date>-cpu-scale-runs.json``.

The job is `examples/ocr-awm.yaml` shortened: no validation, no checkpoints, `--steps` steps of
64 samples (8 prompts × 8), every role one thread (``OMNIRL_LOCAL_THREADS=1``), the launcher and so
every role nice'd. While it runs, a thread reads ``OUT/roles.json`` and samples every second each
role's CPU seconds (``/proc/PID/stat`` utime + stime) and the host's (``/proc/stat``), so a step's
CPU seconds per role, and what the rest of the host used meanwhile (``background_cores``: other
programs' CPU seconds per second), are known. Step times and phases come from ``metrics.jsonl``
(`benchmarks.gpu.service.phases`' definitions). The first step (start-up, first compile of nothing)
is left out of the means.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

import yaml

from omnirl.api.loader import dump_rljob, load_rljob

TICK = os.sysconf("SC_CLK_TCK")
JOB = "examples/ocr-awm.yaml"


def _proc_cpu(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15 of stat)


def _host_busy() -> float:
    """CPU seconds the whole host has been busy (all but idle and iowait) since boot."""
    parts = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(parts) - parts[3] - parts[4]) / TICK


class Sampler(threading.Thread):
    """Every `period` s: (time, host busy CPU s, {role: CPU s}) while `out`'s roles.json names the roles."""

    def __init__(self, out: Path, period: float = 1.0):
        super().__init__(daemon=True)
        self.out, self.period = out, period
        self.samples: list[tuple[float, float, dict[str, float]]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        last: dict[str, float] = {}
        while not self.stop.wait(self.period):
            try:
                pids = json.loads((self.out / "roles.json").read_text())
            except (OSError, ValueError):
                continue
            for name, pid in pids.items():
                cpu = _proc_cpu(pid)
                if cpu is not None:
                    last[name] = cpu  # a process that exited keeps its last reading
            self.samples.append((time.time(), _host_busy(), dict(last)))


def _cpu_between(samples: list, t0: float, t1: float) -> tuple[dict[str, float], float, float]:
    """({role: CPU s}, host busy CPU s, wall s) between the samples nearest to t0 and t1."""
    a = min(samples, key=lambda s: abs(s[0] - t0))
    b = min(samples, key=lambda s: abs(s[0] - t1))
    roles = {k: b[2][k] - a[2].get(k, 0.0) for k in b[2]}
    return roles, b[1] - a[1], b[0] - a[0]


def run_config(rollout: int, actor: int, steps: int, work: Path) -> dict:
    """One `omnirl run`; returns its phases, step times, per-role CPU seconds per step and the host's load."""
    doc = dump_rljob(load_rljob(JOB))
    name = f"scale-r{rollout}-a{actor}"
    doc["metadata"]["name"] = name
    doc["spec"]["data"]["validationPrompts"] = None
    doc["spec"]["checkpoint"]["everySteps"] = 0
    doc["spec"]["roles"]["rollout"]["replicas"] = rollout
    doc["spec"]["roles"]["actor"]["replicas"] = actor
    manifest = work / f"{name}.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    out = work / f"out-{name}"
    sampler = Sampler(out)
    sampler.start()
    env = {**os.environ, "OMNIRL_LOCAL_THREADS": "1"}
    t_start = time.time()
    proc = subprocess.run(["nice", "-n", "10", sys.executable, "-m", "omnirl.cli", "run", str(manifest), "--steps",
                           str(steps), "--out", str(out), "--no-ray"], capture_output=True, text=True, env=env)
    sampler.stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step_rows = [r for r in rows if r.get("event") == "step"]
    measured = step_rows[1:]
    ends = [r["time"] for r in step_rows]
    roles, host, wall = _cpu_between(sampler.samples, ends[0], ends[-1])
    n = len(measured)
    ours = sum(roles.values())
    mean = lambda key: statistics.fmean(r[key] for r in measured)  # noqa: E731
    return {
        "rollout": rollout, "actor": actor, "steps_measured": n, "samples_per_step": measured[0]["samples"],
        "step_seconds": mean("step_seconds"), "step_seconds_all": [r["step_seconds"] for r in step_rows],
        "phases": {"rollout": mean("rollout_seconds"), "reward": mean("reward_seconds") - mean("rollout_seconds"),
                   "load": mean("load_seconds"), "train": mean("train_seconds"), "sync": mean("sync_seconds"),
                   "handoff_to_trained": mean("handoff_to_trained_seconds")},
        "cpu_s_per_step": {k: v / n for k, v in sorted(roles.items())},
        "host_busy_cores": host / wall, "our_cores": ours / wall, "background_cores": max(0.0, (host - ours) / wall),
        "load_average": os.getloadavg(), "wall_seconds": time.time() - t_start,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="1x1,2x1,4x1,1x2,2x2,4x2", help="RxA: rollout replicas x actor ranks")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--note", default="")
    args = p.parse_args()
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r, a in configs:
            row = run_config(r, a, args.steps, Path(tmp))
            rows.append(row)
            print(f"{r}x{a}: step {row['step_seconds']:.2f} s, phases {json.dumps({k: round(v, 2) for k, v in row['phases'].items()})}, "
                  f"background {row['background_cores']:.2f} cores, CPU/step "
                  f"{json.dumps({k: round(v, 2) for k, v in row['cpu_s_per_step'].items()})}", flush=True)
    path = Path(args.out) / f"{date.today()}-cpu-scale-runs.json"
    path.write_text(json.dumps({"date": str(date.today()), "job": JOB, "note": args.note, "cpus": os.cpu_count(),
                                "command": "python -m benchmarks.scale.cpu_runs " + " ".join(sys.argv[1:]),
                                "rows": rows}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
