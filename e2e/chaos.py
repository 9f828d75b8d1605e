"""`make chaos`: faults injected into real jobs, then the ledger proves nothing was lost or doubled.

Each run is a tiny job (`omnirl run --no-ray`: real role processes, the embedded redis-server with
AOF, the local supervisor). A seeded schedule injects faults at random moments, reading the current
process ids from `OUT/roles.json`: SIGKILL of the rollout, reward, actor or controller process,
SIGKILL of redis-server (restarted with its AOF by the launcher), and SIGSTOP of a worker (it
stops beating; the supervisor kills and replaces it after `progressDeadlineSeconds`, longer than
`claimIdleSeconds`). After each run the ledger check (`omnirl ledger`'s
`omnirl.evaluation.ledger.check_ledger`) proves: the job
finished; every sample trained into the final weights was generated once, scored once and trained
once; every step is in the final weights with whole groups. The suite ends with one line:

    kills=K generated=G scored=S trained=T lost=L duplicated=D wasted=W

Usage: `CHAOS_RUNS=N CHAOS_SEED=S CHAOS_KILLS=K make chaos` (K faults per run at most).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from omnirl.evaluation.ledger import LedgerCounts, check_ledger

ROOT = Path(__file__).resolve().parents[1]
# fault → weight in the schedule
FAULTS = {"rollout": 3, "reward": 3, "actor": 1, "controller": 1, "redis": 1, "sigstop": 1}


def chaos_job(tmp: Path, name: str, steps: int) -> Path:
    """A tiny FlowGRPO job (sync mode, 2 prompts × 3 samples, 4 sampling steps) tuned for faults."""
    doc = yaml.safe_load((ROOT / "examples" / "ocr-flowgrpo.yaml").read_text())
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    spec["data"] = {"trainPrompts": str(ROOT / "examples/prompts/ocr-train.txt")}
    algo = spec["algorithm"]
    algo.update(steps=steps, groupSize=3, promptsPerStep=2)
    algo["sampling"] = {"numSteps": 4}
    algo["flowGrpo"]["window"] = {"size": 2, "range": [0, 3]}
    algo["optimizer"] = {"learningRate": 1e-4, "microBatchSize": 6, "updatesPerStep": 1}
    spec["pipeline"] = {"mode": "async-reward"}
    spec["checkpoint"] = {"everySteps": 2, "keep": 1}
    spec["transferQueue"] = {"claimIdleSeconds": 5}
    spec["failurePolicy"] = {"maxRestarts": 100, "progressDeadlineSeconds": 60, "terminationGracePeriodSeconds": 30}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@dataclass
class Counts(LedgerCounts):
    """The suite's numbers: a run's ledger counts (`omnirl ledger`'s, `evaluation/ledger.py`) and its faults."""

    kills: int = 0

    @classmethod
    def of(cls, counts: LedgerCounts, kills: int) -> Counts:
        """One run's ledger counts with its faults."""
        return cls(**{f.name: getattr(counts, f.name) for f in fields(LedgerCounts)}, kills=kills)

    def add(self, other: Counts) -> None:
        """Sum `other` into this."""
        for k in ("kills", "generated", "scored", "trained", "lost", "duplicated", "wasted"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        self.problems += other.problems

    def line(self) -> str:
        """The suite's summary line."""
        return f"kills={self.kills} " + super().line()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def run_once(tmp: Path, index: int, rng: random.Random, steps: int, max_kills: int,
             gap_s: tuple[float, float] = (1.5, 4.0), timeout_s: float = 1200.0) -> Counts:
    """One job under a seeded fault schedule; returns its ledger counts (kills included)."""
    name = f"chaos-{index}"
    job = chaos_job(tmp, name, steps)
    out = tmp / name
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "services"), str(ROOT / "operator"), str(ROOT)])}
    log = (tmp / f"{name}.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "omnirl.cli", "run", str(job), "--out", str(out), "--no-ray"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)
    kills, start = 0, time.monotonic()
    faults, weights = list(FAULTS), list(FAULTS.values())
    next_at = 0.0  # the first fault as soon as the roles are up (roles.json): a quiet machine runs a tiny job in seconds
    try:
        while proc.poll() is None:
            if time.monotonic() - start > timeout_s:
                raise TimeoutError(f"{name} did not finish in {timeout_s:.0f} s (log {tmp / f'{name}.log'})")
            time.sleep(0.2)
            if kills >= max_kills or not (out / "roles.json").exists():
                continue
            if not next_at:
                next_at = time.monotonic() + rng.uniform(*gap_s)
            if time.monotonic() < next_at:
                continue
            next_at = time.monotonic() + rng.uniform(*gap_s)
            fault = rng.choices(faults, weights)[0]
            pids = json.loads((out / "roles.json").read_text())
            target = {"rollout": "rollout-0", "reward": "reward-0", "actor": "actor-0", "controller": "controller-0",
                      "redis": "redis", "sigstop": rng.choice(["rollout-0", "reward-0"])}[fault]
            pid = pids.get(target)
            if pid is None or not _alive(pid):
                continue
            os.kill(pid, signal.SIGSTOP if fault == "sigstop" else signal.SIGKILL)
            kills += 1
            print(f"  {name}: t={time.monotonic() - start:5.1f}s {'SIGSTOP' if fault == 'sigstop' else 'SIGKILL'} "
                  f"{target} (pid {pid})", flush=True)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    if proc.returncode != 0:
        return Counts(lost=steps * 6, kills=kills, problems=[f"{name}: exit {proc.returncode} (log {tmp / f'{name}.log'})"])
    return Counts.of(check_ledger(out, steps, 3, 2), kills)


def suite(tmp: Path, runs: int, seed: int, steps: int = 4, max_kills: int = 12) -> Counts:
    """`runs` chaos runs; prints each run's counts and the summary line; returns the totals."""
    rng = random.Random(seed)
    total = Counts()
    for i in range(runs):
        c = run_once(tmp, i, rng, steps, max_kills)
        print(f"run {i}: {c.line()}" + (f"  PROBLEMS: {c.problems}" if c.problems else ""), flush=True)
        total.add(c)
    share = total.wasted / total.generated if total.generated else 0.0
    print(f"waste share {share:.1%} of generated samples", flush=True)
    print(total.line(), flush=True)
    return total


def main() -> int:
    """`make chaos`: exit 1 unless lost=0 duplicated=0."""
    import tempfile

    runs = int(os.environ.get("CHAOS_RUNS", "3"))
    seed = int(os.environ.get("CHAOS_SEED", "0"))
    kills = int(os.environ.get("CHAOS_KILLS", "10"))
    steps = int(os.environ.get("CHAOS_STEPS", "4"))
    tmp = Path(os.environ.get("CHAOS_DIR") or tempfile.mkdtemp(prefix="omnirl-chaos-"))
    tmp.mkdir(parents=True, exist_ok=True)
    print(f"chaos: {runs} runs, seed {seed}, up to {kills} faults each, in {tmp}", flush=True)
    total = suite(tmp, runs, seed, steps, kills)
    return 0 if total.lost == 0 and total.duplicated == 0 and not total.problems else 1


if __name__ == "__main__":
    sys.exit(main())
