"""Held-out reward by wall clock (5 / 10 / 15 min) of one algorithm on a task, as the digits demo's table has.

One run of an example manifest through `omnirl run` (real role processes and Redis, as `make demo-omni`), pinned
to the given cores, stopped M minutes after the controller's start; its validations' held-out weighted reward and
each reward term at every mark go into one JSON under benchmarks/results/. A second verb renders the docs table
from such JSONs, with "not measured yet" for an algorithm that has none.

    # one algorithm, on cores 0 and 1, for 15 minutes (JSON: benchmarks/results/<date>-cpu-by-minute-avdigits-awm.json)
    python -m benchmarks.by_minute run examples/avdigits-awm.yaml --cores 0,1 --minutes 15 --validate-every 5
    # the four side by side on a 16-core machine, each on its own 2 cores
    for a in flowgrpo:0,1 nft:2,3 awm:4,5 dgpo:6,7; do
      python -m benchmarks.by_minute run examples/avdigits-${a%%:*}.yaml --cores ${a#*:} --minutes 15 --validate-every 5 &
    done; wait
    # the table in docs/omni.md (between its by-minute markers)
    python -m benchmarks.by_minute table benchmarks/results/*-cpu-by-minute-avdigits-*.json --write docs/omni.md
    # seconds, for a test: 2 steps of 2 prompts x 4 samples, 4 held-out prompts, marks at 0.25 / 0.5 / 5 min
    python -m benchmarks.by_minute run examples/avdigits-awm.yaml --smoke --out /tmp/bym --minutes 5

Clock: minutes from the controller's `start` record in the run's `metrics.jsonl` (tools/demo_table.py's origin;
the seconds from launch to it are recorded as `launch_seconds`). A mark's value is the last validation finished
by then. Cores: the process pins itself (and so its children: roles, redis-server) with `sched_setaffinity`;
`omnirl run` gives its roles threads for the cores it may use (`api/runtime.py::usable_cores`: 2 → rollout and
actor 2 torch threads each, reward and controller 1, as on a 2-core machine). Roles run as plain processes
(`--no-ray`: one Ray per job would not share a machine well).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml
from tools.demo_table import reward_at

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MARKS = (5.0, 10.0, 15.0)
ALGORITHMS = {"flow-grpo": "FlowGRPO", "diffusion-nft": "DiffusionNFT", "awm": "AWM", "dgpo": "DGPO"}
"""`spec.algorithm.name` → the name the docs use, in the table's order."""
EXAMPLES = {"flow-grpo": "examples/avdigits-flowgrpo.yaml", "diffusion-nft": "examples/avdigits-nft.yaml",
            "awm": "examples/avdigits-awm.yaml", "dgpo": "examples/avdigits-dgpo.yaml"}
"""The av-digits manifest of each algorithm (the placeholder rows name them)."""
AV_TERMS = ("ocr", "beeps", "pitch", "sync")
BEGIN, END = "<!-- by-minute:begin -->", "<!-- by-minute:end -->"
NOT_MEASURED = "not measured yet"
STOP_GRACE_S = 180.0
"""How long the launcher gets after SIGTERM to stop its roles (Ctrl-C's path) before its group is killed."""


# ---------------------------------------------------------------- reading a run


def read_records(metrics: Path) -> list[dict]:
    """The JSON lines of a run's `metrics.jsonl` (a line cut by the stop is skipped)."""
    out = []
    for line in metrics.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def summarize(records: list[dict], terms: list[str], marks: tuple[float, ...] | list[float] = MARKS) -> dict:
    """The held-out weighted reward and each term at each mark, and every validation, of one run's records.

    Args:
        records: `metrics.jsonl` records (`start`, `step`, `validation` events; `time` in unix seconds).
        terms: the reward names (`spec.reward[].name`); a validation's `val_reward_<name>` is that term's mean.
        marks: minutes after the controller's start.
    Returns:
        `{"start_time", "validations": [{step, minutes, reward, terms}], "marks": [{minutes, step, at_minutes,
        reward, terms} | {minutes, step: None} when nothing was validated by then], "steps_done",
        "seconds_per_step_median", "last_step_minutes"}`.
    Raises:
        ValueError: no `start` record (not a run's metrics, or the run never started).
    """
    starts = [r["time"] for r in records if r.get("event") == "start"]
    if not starts:
        raise ValueError("metrics.jsonl has no 'start' record: the controller never started (see the run's log)")
    start = starts[0]
    vals = [r for r in records if r.get("event") == "validation" and r.get("val_reward_mean") is not None]

    def row(v: dict) -> dict:
        return {"step": v["step"], "minutes": round((v["time"] - start) / 60.0, 3),
                "reward": round(v["val_reward_mean"], 4),
                "terms": {t: None if v.get(f"val_reward_{t}") is None else round(v[f"val_reward_{t}"], 4)
                          for t in terms}}

    out_marks = []
    for m in marks:
        v = reward_at(start, vals, m)
        if v is None:
            out_marks.append({"minutes": m, "step": None, "at_minutes": None, "reward": None, "terms": {}})
        else:
            r = row(v)
            out_marks.append({"minutes": m, "step": r["step"], "at_minutes": r["minutes"], "reward": r["reward"],
                              "terms": r["terms"]})
    steps = [r for r in records if r.get("event") == "step"]
    gaps = [b["time"] - a["time"] for a, b in zip(steps, steps[1:], strict=False)]
    return {"start_time": start, "validations": [row(v) for v in vals], "marks": out_marks,
            "steps_done": len(steps), "seconds_per_step_median": round(statistics.median(gaps), 2) if gaps else None,
            "last_step_minutes": round((steps[-1]["time"] - start) / 60.0, 3) if steps else None}


# ---------------------------------------------------------------- running one


def effective_manifest(manifest: Path, out_dir: Path, *, validate_every: int | None, smoke: bool) -> Path:
    """The manifest the run uses, written beside the run directory: data paths made absolute, validation every
    `validate_every` steps (None: the manifest's), and with `smoke` the job shrunk to seconds (2 steps of
    2 prompts × 4 samples, 4 denoising steps, 4 held-out prompts validated at steps 0, 1 and 2)."""
    doc = yaml.safe_load(manifest.read_text())
    spec = doc["spec"]
    spec["data"] = {k: str((manifest.parent / v).resolve()) if isinstance(v, str) else v
                    for k, v in spec["data"].items()}
    if validate_every is not None:
        spec.setdefault("validation", {})["everySteps"] = validate_every
    if smoke:
        algo = spec["algorithm"]
        algo.update(steps=2, groupSize=4, promptsPerStep=2)
        algo.setdefault("sampling", {})["numSteps"] = 4
        algo.setdefault("optimizer", {})["microBatchSize"] = 8
        if "flowGrpo" in algo:
            algo["flowGrpo"]["window"] = {"size": 2, "range": [0, 2]}
        spec["validation"] = {"everySteps": 1, "numSteps": 4, "maxPrompts": 4}
        spec["checkpoint"] = {"everySteps": 2, "keep": 1}
    path = out_dir.parent / f"{out_dir.name}.job.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _start_time(metrics: Path) -> float | None:
    if not metrics.is_file():
        return None
    starts = [r["time"] for r in read_records(metrics) if r.get("event") == "start"]
    return starts[0] if starts else None


def run(manifest: Path, *, minutes: float, out_dir: Path, cores: list[int] | None, validate_every: int | None,
        steps: int | None, smoke: bool, marks: list[float], log=print) -> dict:
    """Run `manifest` with `omnirl run --no-ray` until it ends or `minutes` after the controller's start (then
    SIGTERM, Ctrl-C's path; its process group is killed after `STOP_GRACE_S`); returns the result document.

    Raises:
        FileExistsError: `out_dir` exists (a run there would resume or mix two runs' metrics).
        RuntimeError: the run ended without its controller starting (its log's tail in the message).
    """
    if out_dir.exists():
        raise FileExistsError(f"--out {out_dir} exists; pass a new directory (a run there would mix two runs)")
    if cores:
        os.sched_setaffinity(0, set(cores))  # inherited by omnirl run, its roles and its redis-server
    job_path = effective_manifest(manifest, out_dir, validate_every=validate_every, smoke=smoke)
    job = yaml.safe_load(job_path.read_text())
    terms = [r["name"] for r in job["spec"]["reward"]]
    cmd = [sys.executable, "-m", "omnirl.cli", "run", str(job_path), "--out", str(out_dir), "--no-ray"]
    cmd += ["--steps", str(steps)] if steps else []
    env = {k: v for k, v in os.environ.items() if k != "OMNIRL_LOCAL_THREADS"}  # threads follow the cores
    log_path = out_dir.parent / f"{out_dir.name}.log"
    load_start, launched = os.getloadavg(), time.time()
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log(f"by_minute: pid {proc.pid} on cores {sorted(os.sched_getaffinity(0))}: {' '.join(cmd)} (log {log_path})")
        start, stopped = None, False
        while proc.poll() is None:
            start = start or _start_time(out_dir / "metrics.jsonl")
            if start is not None and time.time() >= start + minutes * 60.0 and not stopped:
                log(f"by_minute: {minutes:g} min since the controller's start: stopping pid {proc.pid}")
                proc.send_signal(signal.SIGTERM)
                stopped = True
                try:
                    proc.wait(timeout=STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)  # our child's own session: nothing else is in it
                    proc.wait()
                break
            time.sleep(1.0)
    metrics = out_dir / "metrics.jsonl"
    if not metrics.is_file() or _start_time(metrics) is None:
        raise RuntimeError(f"the run exited {proc.returncode} before its controller started; "
                           f"its log ends:\n{log_path.read_text()[-3000:]}")
    summary = summarize(read_records(metrics), terms, marks)
    algo = job["spec"]["algorithm"]["name"]
    return {
        "benchmark": "by-minute", "date": dt.date.today().isoformat(), "job": job["metadata"]["name"],
        "algorithm": algo, "manifest": str(manifest), "smoke": smoke, "minutes_limit": minutes, "marks_minutes": marks,
        "validate_every": job["spec"].get("validation", {}).get("everySteps"),
        "validation_prompts": job["spec"].get("validation", {}).get("maxPrompts"),
        "terms": terms, "weights": {r["name"]: r.get("weight", 1.0) for r in job["spec"]["reward"]},
        "command": " ".join([Path(sys.executable).name, "-m", "benchmarks.by_minute", *sys.argv[1:]]),
        "run_command": " ".join(cmd), "exit_code": proc.returncode, "stopped_at_limit": stopped,
        "commit": _git("rev-parse", "HEAD"), "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "cores": sorted(os.sched_getaffinity(0)), "machine_cpus": os.cpu_count(), "cpu_model": _cpu_model(),
        "loadavg_start": [round(x, 2) for x in load_start], "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "launch_seconds": round(summary["start_time"] - launched, 1), **summary,
    }


# ---------------------------------------------------------------- the docs table


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def render_table(results: list[dict], terms: tuple[str, ...] = AV_TERMS, include_smoke: bool = False) -> str:
    """Markdown: for each algorithm (FlowGRPO, DiffusionNFT, AWM, DGPO), the base model (step 0) and each mark:
    step, held-out weighted sum and each term; an algorithm with no result is one row saying `not measured yet`.
    With several results of one algorithm the newest (date, then file order) is shown. Smoke runs are left out
    unless `include_smoke` (a look at the tool's own output)."""
    newest: dict[str, dict] = {}
    for r in results:
        if (include_smoke or not r.get("smoke")) and (r["algorithm"] not in newest or r["date"] >= newest[r["algorithm"]]["date"]):
            newest[r["algorithm"]] = r
    head = ["algorithm (manifest)", "minutes", "step", "held-out sum", *terms]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    notes = []
    for algo, label in ALGORITHMS.items():
        r = newest.get(algo)
        name = f"{label} (`{EXAMPLES[algo] if r is None else r['manifest']}`)"
        if r is None:
            rows.append(f"| {name} | 5 / 10 / 15 | {NOT_MEASURED} | {NOT_MEASURED} |" + " — |" * len(terms))
            continue
        base = r["validations"][0] if r["validations"] and r["validations"][0]["step"] == 0 else None
        entries = [("base", base and {**base, "at_minutes": base["minutes"]})] + [
            (f"{m['minutes']:g}", m if m["step"] is not None else None) for m in r["marks"]]
        for i, (when, v) in enumerate(entries):
            first = name if i == 0 else ""
            if v is None:
                rows.append(f"| {first} | {when} | — | no validation finished yet |" + " — |" * len(terms))
                continue
            rows.append(f"| {first} | {when} | {v['step']} (at {v['at_minutes']:.1f} min) | {_cell(v['reward'])} | "
                        + " | ".join(_cell(v["terms"].get(t)) for t in terms) + " |")
        notes.append(f"{label}: {r['date']}, commit {(r.get('commit') or '?')[:7]}{' (dirty)' if r.get('dirty') else ''}"
                     f", cores {','.join(map(str, r['cores']))} of {r['machine_cpus']} ({r.get('cpu_model') or '?'}), "
                     f"load {r['loadavg_start'][0]:g} → {r['loadavg_end'][0]:g}, {r['steps_done']} steps, "
                     f"{r['seconds_per_step_median']} s/step (median), validation of {r['validation_prompts']} "
                     f"prompts every {r['validate_every']} steps, launch {r['launch_seconds']:g} s before the clock")
    lines = rows + ([""] + [f"- {n}" for n in notes] if notes else [])
    return "\n".join(lines)


def write_docs(page: Path, table: str) -> bool:
    """Put `table` between `BEGIN` and `END` in `page`; returns whether the page changed.

    Raises:
        ValueError: the page lacks the two markers (in that order).
    """
    text = page.read_text()
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{page}: no '{BEGIN}' … '{END}' markers to write the table between")
    new = pattern.sub(lambda _: f"{BEGIN}\n{table}\n{END}", text, count=1)
    page.write_text(new)
    return new != text


def committed_results() -> list[Path]:
    """The av-digits by-minute results in benchmarks/results/ (what the docs table is rendered from)."""
    return sorted(RESULTS.glob("*-cpu-by-minute-avdigits-*.json"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.by_minute", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="verb", required=True)
    r = sub.add_parser("run", help="run one manifest for up to --minutes and write its JSON")
    r.add_argument("manifest", type=Path)
    r.add_argument("--minutes", type=float, default=15.0, help="stop this long after the controller's start")
    r.add_argument("--marks", type=float, nargs="+", default=None,
                   help="minutes to report (default 5 10 15; with --smoke 0.25 0.5 and --minutes)")
    r.add_argument("--cores", default=None, help="CPU cores to pin to, e.g. 0,1 (default: this process's)")
    r.add_argument("--validate-every", type=int, default=None,
                   help="held-out validation every N steps (default: the manifest's)")
    r.add_argument("--steps", type=int, default=None, help="omnirl run --steps (default: the manifest's)")
    r.add_argument("--out", type=Path, default=None, help="run directory (default runs/by-minute-<job>)")
    r.add_argument("--result", type=Path, default=None, help="JSON path (default benchmarks/results/"
                   "<date>-cpu-by-minute-<job>.json; with --smoke OUT.json)")
    r.add_argument("--smoke", action="store_true", help="the job shrunk to seconds (a test of this tool)")
    t = sub.add_parser("table", help="render the docs table from result JSONs")
    t.add_argument("results", type=Path, nargs="*", help="result JSONs (default: benchmarks/results' av-digits ones)")
    t.add_argument("--write", type=Path, default=None, help="a docs page with the by-minute markers to update")
    t.add_argument("--include-smoke", action="store_true", help="show --smoke results too (never in the docs)")
    args = p.parse_args(argv)
    if args.verb == "table":
        table = render_table([json.loads(f.read_text()) for f in (args.results or committed_results())],
                             include_smoke=args.include_smoke and not args.write)
        if args.write:
            print(f"{args.write}: {'updated' if write_docs(args.write, table) else 'unchanged'}")
        else:
            print(table)
        return 0
    name = yaml.safe_load(args.manifest.read_text())["metadata"]["name"]
    out = args.out or ROOT / "runs" / f"by-minute-{name}"
    marks = args.marks or ([0.25, 0.5, args.minutes] if args.smoke else list(MARKS))
    cores = [int(c) for c in args.cores.split(",")] if args.cores else None
    doc = run(args.manifest, minutes=args.minutes, out_dir=out, cores=cores, validate_every=args.validate_every,
              steps=args.steps, smoke=args.smoke, marks=marks)
    result = args.result or (out.parent / f"{out.name}.json" if args.smoke
                             else RESULTS / f"{doc['date']}-cpu-by-minute-{name}.json")
    result.parent.mkdir(parents=True, exist_ok=True)
    result.write_text(json.dumps(doc, indent=1) + "\n")
    for m in doc["marks"]:
        print(f"{m['minutes']:g} min: " + ("no validation finished" if m["step"] is None else
              f"step {m['step']} reward {m['reward']:.3f} " + " ".join(f"{k} {_cell(v)}" for k, v in m["terms"].items())))
    print(f"by_minute: wrote {result}")
    return 0 if doc["exit_code"] in (0, None) or doc["stopped_at_limit"] else 1


if __name__ == "__main__":
    sys.exit(main())
