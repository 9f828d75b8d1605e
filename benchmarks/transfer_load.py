"""TransferQueue load test: N producers × M consumers (processes) against one real redis-server.

Run: ``python -m benchmarks.transfer_load [--kinds img512,img1024,video33,av81] [--levels 1x1,2x2,4x4,8x8,16x16]
[--duration 15] [--out benchmarks/results]``; ``--quick`` is the < 60 s smoke run (tiny payloads,
2 × 2, abandoned batches reclaimed) that ``tests/benchmarks/test_bench_transfer_load.py`` checks.

Each run (a payload kind at a level N × M) starts its own ``redis-server`` on a free loopback port
(`omnirl.transfer.start_redis_server`: nothing persisted, nothing else on it) and forks a controller,
N rollout producers, M reward consumers and A actor readers running the real roles' TransferQueue
calls (`benchmarks.transfer_load_roles`). Producers publish for ``--warmup + --duration`` seconds;
then everything published is drained (scored, read by an actor, deleted) and checked: every
published sample scored exactly once and read exactly once by an actor, nothing pending, no
tensor key left. Measured over the ``--duration`` window after ``--warmup``:

- samples/s: first deliveries to a reward consumer in the window / its length;
- MB/s: samples/s × the sample's stored bytes (trajectory + media safetensors); Redis moves each
  byte twice (in from the producer, out to a reward or an actor), ``redis_net_mb_s`` counts both;
- publish-to-consume latency p50 / p99: reward consume time − the publish's start (first
  deliveries; a reclaimed entry's second delivery is not a latency);
- Redis CPU: Δ(``used_cpu_sys`` + ``used_cpu_user``) / Δwall from INFO (1.0 = the one core a
  redis-server uses), its CPU seconds per sample, and commands per sample (INFO commandstats);
- Redis memory: the largest ``used_memory`` polled every 0.25 s and ``used_memory_peak``.

The sweep of a kind stops at the first level where Redis CPU reaches ``--saturation`` (Redis
saturated) or samples/s grew less than 10% over the previous level (flat: the clients or the
host's cores are the limit, which the row says). ``--budget-s`` bounds the whole sweep.
The calibration the simulation uses (`benchmarks.scale`) is a least-squares fit over every run of
Redis CPU seconds = ``s_per_sample`` × samples + ``s_per_byte`` × network bytes (`fit_calibration`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue as queue_mod
import sys
import time
from dataclasses import asdict
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import redis

from benchmarks.transfer_load_payloads import KINDS, stored_bytes
from benchmarks.transfer_load_roles import (
    GROUPS,
    JOB,
    LoadConfig,
    actor,
    controller,
    ensure_groups,
    reward,
    rollout,
)
from omnirl.transfer import StreamNames, start_redis_server

MB = 1e6
FULL_KINDS = ("img512", "img1024", "video33", "av81")
FULL_LEVELS = ((1, 1), (2, 2), (4, 4), (8, 8), (16, 16))
BATCH = {"img512": 16, "img1024": 8, "video33": 4, "av81": 4, "tiny": 4}
"""Reward batch per kind: a 16-image batch of video would hold 230–430 MB in one worker."""


def _snapshot(client: redis.Redis) -> dict:
    """INFO cpu, stats, memory and commandstats at one instant."""
    info = client.info("all")
    calls = {k[len("cmdstat_"):]: (v["calls"], v["usec"]) for k, v in info.items() if k.startswith("cmdstat_")}
    return {"t": time.time(), "cpu_s": info["used_cpu_sys"] + info["used_cpu_user"],
            "net_in": info["total_net_input_bytes"], "net_out": info["total_net_output_bytes"],
            "used_memory": info["used_memory"], "commands": calls}


def _delta_commands(a: dict, b: dict) -> dict[str, tuple[int, int]]:
    out = {}
    for cmd, (calls, usec) in b["commands"].items():
        c0, u0 = a["commands"].get(cmd, (0, 0))
        if calls - c0:
            out[cmd] = (calls - c0, usec - u0)
    return out


def run_level(kind: str, producers: int, consumers: int, actors: int, *, duration_s: float = 15.0,
              warmup_s: float = 2.0, drain_s: float = 120.0, **overrides: Any) -> dict:
    """One run: a fresh redis-server, the processes, the window, the drain and the checks.

    Args:
        kind: a payload kind (`benchmarks.transfer_load_payloads.KINDS`).
        producers, consumers, actors: rollout, reward and actor processes (≥ 1 each).
        duration_s: the measured window (s), after `warmup_s`.
        drain_s: bound (s) on draining what was published once the producers stopped.
        overrides: `LoadConfig` fields (window, group, batch, train_batch, claim_idle_s, abandon_every,
            max_stream_length, in_flight: by default two groups per producer or two batches per consumer,
            whichever is more, plus a group).

    Returns:
        The row: the inputs, ``samples_per_s``, ``mb_per_s``, ``latency_p50_ms``/``latency_p99_ms``,
        ``redis_cpu`` (cores), ``redis_cpu_s_per_sample``, ``commands_per_sample``, ``redis_net_mb_s``,
        ``redis_memory_mb`` (largest polled), ``redis_memory_peak_mb``, ``commands`` (per command: calls, usec
        in the window), and the delivery check ``published``, ``scored``, ``trained``, ``lost``, ``duplicated``,
        ``abandoned``, ``redelivered``, ``left`` (pending entries + tensor keys after the drain).

    Raises:
        ValueError: an unknown kind or a count < 1.
        RuntimeError: a process failed (its traceback), the drain did not finish, or the checks failed
            (lost or duplicated samples, leftovers): the message names the counts.
    """
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: expected one of {sorted(KINDS)}")
    if min(producers, consumers, actors) < 1:
        raise ValueError(f"producers, consumers and actors must be >= 1, got {producers}, {consumers}, {actors}")
    server = start_redis_server()
    try:
        batch = overrides.pop("batch", BATCH[kind])
        group = overrides.get("group", LoadConfig.group)
        in_flight = overrides.pop("in_flight", max(2 * group * producers, 2 * batch * consumers) + group)
        cfg = LoadConfig(url=server.url, kind=kind, batch=batch, in_flight=in_flight, **overrides)
        return _run(server.url, cfg, producers, consumers, actors, duration_s, warmup_s, drain_s)
    finally:
        server.stop()


def _run(url: str, cfg: LoadConfig, producers: int, consumers: int, actors: int, duration_s: float,
         warmup_s: float, drain_s: float) -> dict:
    client = redis.Redis.from_url(url)
    setup = cfg.queue()
    ensure_groups(setup)
    setup.close()
    ctx = mp.get_context("fork")  # torch is imported already; fork starts a role in milliseconds
    go, stop, done = ctx.Event(), ctx.Event(), ctx.Event()
    expected, scored, trained = ctx.Value("q", 0), ctx.Value("q", 0), ctx.Value("q", 0)
    out = ctx.Queue()
    procs = [ctx.Process(target=controller, args=(cfg, stop, done, expected, scored, out))]
    procs += [ctx.Process(target=rollout, args=(cfg, i, go, stop, out)) for i in range(producers)]
    procs += [ctx.Process(target=reward, args=(cfg, i, go, done, out)) for i in range(consumers)]
    procs += [ctx.Process(target=actor, args=(cfg, i, go, done, trained, out)) for i in range(actors)]
    for p in procs:
        p.start()
    reports: list[dict] = []
    try:
        go.set()
        t_go = time.time()
        time.sleep(warmup_s)
        snap0 = _snapshot(client)
        memory = [snap0["used_memory"]]
        while time.time() < t_go + warmup_s + duration_s:
            time.sleep(0.25)
            memory.append(int(client.info("memory")["used_memory"]))
        snap1 = _snapshot(client)
        stop.set()
        reports += _collect(out, procs, lambda r: sum(x["role"] == "rollout" for x in r) == producers, reports,
                            deadline=time.time() + drain_s)
        published = [s for r in reports if r["role"] == "rollout" for s in r["published"]]
        expected.value = max(len(published), 1)
        deadline = time.time() + drain_s
        while (scored.value < len(published) or trained.value < len(published)
               or _pending(client, StreamNames(JOB).samples)) and time.time() < deadline:
            _raise_errors(_drain(out, reports))
            time.sleep(0.05)
            memory.append(int(client.info("memory")["used_memory"]))
        done.set()
        reports += _collect(out, procs, lambda r: len(r) == len(procs), reports, deadline=time.time() + 60)
    finally:
        stop.set()
        done.set()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    peak = int(client.info("memory")["used_memory_peak"])
    left = _leftovers(cfg, client)
    client.close()
    return _row(cfg, producers, consumers, actors, duration_s, warmup_s, reports, snap0, snap1, memory, peak,
                left)


def _pending(client: redis.Redis, stream: str) -> int:
    """Entries of `stream` delivered to the reward group and not acknowledged (an abandoned batch whose
    scores were published is still waiting for its reclaim)."""
    return int(client.xpending(stream, GROUPS["samples"])["pending"])


def _drain(out: Any, into: list[dict]) -> list[dict]:
    """Every report waiting on `out` appended to `into`; returns the new ones."""
    new = []
    while True:
        try:
            new.append(out.get_nowait())
        except queue_mod.Empty:
            into.extend(new)
            return new


def _raise_errors(reports: list[dict]) -> None:
    for r in reports:
        if "error" in r:
            raise RuntimeError(f"{r['role']}-{r['index']} failed:\n{r['error']}")


def _collect(out: Any, procs: list, enough: Any, reports: list[dict], deadline: float) -> list[dict]:
    """Reports from `out` until `enough(reports + new)` or `deadline`; raises a process's error."""
    new: list[dict] = []
    while not enough(reports + new):
        if time.time() > deadline:
            dead = [p.pid for p in procs if not p.is_alive() and p.exitcode not in (0, None)]
            raise RuntimeError(f"load test: reports missing at the deadline ({len(reports) + len(new)} in; "
                               f"processes that died: {dead})")
        try:
            new.append(out.get(timeout=0.2))
        except queue_mod.Empty:
            continue
        _raise_errors(new[-1:])
    return new


def _leftovers(cfg: LoadConfig, client: redis.Redis) -> dict:
    """Pending entries per stream and tensor/image keys still in Redis after the drain."""
    q = cfg.queue()
    pending = {stream: q.pending_count(getattr(q.streams, stream), group) for stream, group in GROUPS.items()}
    q.close()
    keys = sum(1 for _ in client.scan_iter(f"omnirl:{JOB}:tensors:*", count=1000))
    keys += sum(1 for _ in client.scan_iter(f"omnirl:{JOB}:images:*", count=1000))
    return {"pending": pending, "tensor_keys": keys}


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _row(cfg: LoadConfig, producers: int, consumers: int, actors: int, duration_s: float, warmup_s: float,
         reports: list[dict], snap0: dict, snap1: dict, memory: list[int], peak: int, left: dict) -> dict:
    by_role: dict[str, list[dict]] = {}
    for r in reports:
        by_role.setdefault(r["role"], []).append(r)
    published = [s for r in by_role["rollout"] for s in r["published"]]
    scored = by_role["controller"][0]["scored"]
    trained = [s for r in by_role["actor"] for s in r["trained"]]
    reward_scored = [s for r in by_role["reward"] for s in r["scored"]]
    seen = [x for r in by_role["reward"] for x in r["seen"]]
    t0, t1 = snap0["t"], snap1["t"]
    window = [x for x in seen if x[3] == 1 and t0 <= x[1] <= t1]
    samples_per_s = len(window) / (t1 - t0)
    traj_b, media_b = stored_bytes(KINDS[cfg.kind], cfg.window)
    cmds = _delta_commands(snap0, snap1)
    calls = sum(c for c, _ in cmds.values())
    cpu_s = snap1["cpu_s"] - snap0["cpu_s"]
    net = (snap1["net_in"] - snap0["net_in"]) + (snap1["net_out"] - snap0["net_out"])
    pub = set(published)
    check = {
        "published": len(published), "scored": len(scored), "trained": len(trained),
        "lost": len(pub - set(scored)) + len(pub - set(trained)),
        "duplicated": (len(scored) - len(set(scored))) + (len(trained) - len(set(trained)))
                      + (len(reward_scored) - len(set(reward_scored))) + (len(published) - len(pub)),
        "unknown": len(set(scored) - pub) + len(set(trained) - pub),
        "abandoned": sum(len(r["abandoned"]) for r in by_role["reward"]),
        "redelivered": sum(1 for x in seen if x[3] > 1),
        "left": left,
    }
    return {
        "kind": cfg.kind, "producers": producers, "consumers": consumers, "actors": actors,
        "duration_s": round(t1 - t0, 3), "warmup_s": warmup_s,
        "config": {k: v for k, v in asdict(cfg).items() if k != "url"},
        "sample_bytes": traj_b + media_b, "trajectory_bytes": traj_b, "media_bytes": media_b,
        "window_samples": len(window), "samples_per_s": samples_per_s, "mb_per_s": samples_per_s * (traj_b + media_b) / MB,
        "latency_p50_ms": _ms(_percentile([x[2] for x in window], 50)),
        "latency_p99_ms": _ms(_percentile([x[2] for x in window], 99)),
        "publish_p50_ms": _ms(_percentile([s for r in by_role["rollout"] for s in r["publish_s"]], 50)),
        "redis_cpu": cpu_s / (t1 - t0), "redis_cpu_s": cpu_s, "redis_net_bytes": net,
        "redis_cpu_s_per_sample": cpu_s / len(window) if window else None,
        "commands_per_sample": calls / len(window) if window else None, "redis_commands": calls,
        "redis_net_mb_s": net / MB / (t1 - t0),
        "redis_memory_mb": max(memory) / MB, "redis_memory_peak_mb": peak / MB,
        "commands": {k: {"calls": c, "usec": u} for k, (c, u) in sorted(cmds.items())},
        "check": check,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def check_delivery(row: dict) -> None:
    """Raise RuntimeError unless every published sample was scored and read by an actor exactly once
    and nothing was left pending or stored."""
    c = row["check"]
    leftover = sum(c["left"]["pending"].values()) + c["left"]["tensor_keys"]
    if c["lost"] or c["duplicated"] or c["unknown"] or leftover or not c["published"]:
        raise RuntimeError(f"{row['kind']} {row['producers']}x{row['consumers']}: published {c['published']}, "
                           f"lost {c['lost']}, duplicated {c['duplicated']}, unknown {c['unknown']}, "
                           f"left {c['left']} (all but published must be 0)")


def fit_calibration(rows: list[dict]) -> dict:
    """Least squares over runs: Redis CPU seconds = s_per_sample × samples + s_per_byte × network bytes.

    `samples` are the window's first deliveries (each sample's whole traffic: request share, publish,
    claim, image read, score, acks and trims, the actor's read and delete) and the network bytes are
    INFO's input + output bytes, so ``s_per_sample`` is the per-sample cost of the role traffic's
    commands and ``s_per_byte`` the cost of moving a byte in or out (one core, seconds).

    Returns:
        ``s_per_sample`` (s), ``s_per_byte`` (s/B), ``runs``, ``r2``; ``None`` values with fewer than two
        runs.
    """
    usable = [r for r in rows if r["window_samples"] and r["redis_cpu_s"] > 0]
    if len(usable) < 2:
        return {"s_per_sample": None, "s_per_byte": None, "runs": len(usable), "r2": None}
    a = np.array([[r["window_samples"], r["redis_net_bytes"]] for r in usable], dtype=float)
    y = np.array([r["redis_cpu_s"] for r in usable])
    (s_sample, s_byte), *_ = np.linalg.lstsq(a, y, rcond=None)
    residual = y - a @ np.array([s_sample, s_byte])
    r2 = 1 - float(residual @ residual) / float(((y - y.mean()) ** 2).sum()) if len(y) > 2 else None
    return {"s_per_sample": float(s_sample), "s_per_byte": float(s_byte), "runs": len(usable), "r2": r2}


def sweep(kinds: list[str], levels: list[tuple[int, int]], *, actors: int | None, duration_s: float,
          warmup_s: float, saturation: float, budget_s: float, after_row: Any = None, keep_going: bool = False,
          **overrides: Any) -> tuple[list[dict], dict]:
    """Run each kind up the levels until Redis saturates, the throughput is flat, or the budget is spent.

    `after_row(rows, verdict)` runs after every level (the CLI writes the JSON there, so a run cut short
    keeps what it measured). With `keep_going` a flat level does not stop the kind (only Redis's saturation
    and the budget do): on a many-core host the next level may still grow.

    Returns:
        (rows, per kind ``{"stopped": reason, "max_samples_per_s", "max_mb_per_s", "at"}``).
    """
    rows: list[dict] = []
    verdict: dict[str, dict] = {}
    start = time.time()
    for kind in kinds:
        previous = None
        reason = "all levels ran"
        for n, m in levels:
            if time.time() - start + duration_s + warmup_s > budget_s:
                reason = "time budget spent"
                break
            a = actors if actors is not None else max(1, m // 2)
            row = run_level(kind, n, m, a, duration_s=duration_s, warmup_s=warmup_s, **dict(overrides))
            check_delivery(row)
            rows.append(row)
            print(_line(row), flush=True)
            if row["redis_cpu"] >= saturation:
                row["saturated"] = reason = f"Redis saturated ({row['redis_cpu']:.2f} of a core)"
                break
            if not keep_going and previous is not None and row["samples_per_s"] < 1.1 * previous["samples_per_s"]:
                row["saturated"] = reason = (f"flat (< +10% over {previous['producers']}x{previous['consumers']}) "
                                             f"with Redis at {row['redis_cpu']:.2f} of a core: the clients or the "
                                             "host's cores are the limit")
                break
            previous = row
            verdict[kind] = _verdict(rows, kind, "running")
            if after_row is not None:
                after_row(rows, verdict)
        verdict[kind] = _verdict(rows, kind, reason)
        if after_row is not None:
            after_row(rows, verdict)
    return rows, verdict


def _verdict(rows: list[dict], kind: str, reason: str) -> dict:
    """A kind's best level and what one Redis core carries of it."""
    best = max((r for r in rows if r["kind"] == kind), key=lambda r: r["samples_per_s"], default=None)
    return {"stopped": reason, "max_samples_per_s": best and best["samples_per_s"],
            "max_mb_per_s": best and best["mb_per_s"], "at": best and f"{best['producers']}x{best['consumers']}",
            "redis_cpu_s_per_sample": best and best["redis_cpu_s_per_sample"],
            "one_core_samples_per_s": best and best["redis_cpu_s_per_sample"] and 1 / best["redis_cpu_s_per_sample"]}


HEADER = (f"{'kind':8} {'N×M':>6} {'A':>3} {'MB/sample':>9} {'samples/s':>9} {'MB/s':>8} {'p50 ms':>8} "
          f"{'p99 ms':>8} {'Redis CPU':>9} {'ms CPU/sample':>13} {'cmds/sample':>11} {'mem MB':>8}")


def _line(r: dict) -> str:
    per = r["redis_cpu_s_per_sample"]
    return (f"{r['kind']:8} {str(r['producers']) + 'x' + str(r['consumers']):>6} {r['actors']:>3} "
            f"{r['sample_bytes'] / MB:9.2f} {r['samples_per_s']:9.1f} {r['mb_per_s']:8.1f} "
            f"{r['latency_p50_ms'] or 0:8.1f} {r['latency_p99_ms'] or 0:8.1f} {r['redis_cpu']:9.2f} "
            f"{(per or 0) * 1000:13.3f} {r['commands_per_sample'] or 0:11.1f} {r['redis_memory_mb']:8.0f}")


def _levels(text: str) -> list[tuple[int, int]]:
    try:
        levels = [tuple(int(x) for x in part.split("x")) for part in text.split(",")]
    except ValueError:
        levels = []
    if not levels or any(len(lv) != 2 or min(lv) < 1 for lv in levels):
        raise SystemExit(f"--levels {text!r}: expected NxM pairs of positive ints, e.g. 1x1,2x2,4x4")
    return levels  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> dict:
    """Parse the flags, run the sweep, print the table, write the JSON (unless ``--quick`` without ``--out``)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kinds", default=None, help=f"comma-separated of {sorted(KINDS)} (default: {','.join(FULL_KINDS)})")
    p.add_argument("--levels", default=None, help="NxM producer x consumer levels (default 1x1,...,16x16)")
    p.add_argument("--actors", type=int, default=None, help="actor processes (default: max(1, M // 2))")
    p.add_argument("--duration", type=float, default=15.0, help="measured seconds per run")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds before the window opens")
    p.add_argument("--window", type=int, default=3, help="FlowGRPO SDE window W (W + 1 latents per trajectory)")
    p.add_argument("--claim-idle", type=float, default=5.0, help="claimIdleSeconds (reclaim of abandoned batches)")
    p.add_argument("--abandon-every", type=int, default=50, help="abandon every k-th reward batch (0: never)")
    p.add_argument("--saturation", type=float, default=0.9, help="Redis CPU (cores) that counts as saturated")
    p.add_argument("--budget-s", type=float, default=1200.0, help="bound on the whole sweep (s)")
    p.add_argument("--keep-going", action="store_true", help="a flat level does not stop the kind")
    p.add_argument("--quick", action="store_true", help="< 60 s smoke run: tiny payloads, 2x2, 2 s")
    p.add_argument("--machine", default="", help="free text about the machine, stored in the JSON")
    p.add_argument("--out", default=None, help="directory for <date>-cpu-transfer-load.json "
                   "(default benchmarks/results; none with --quick)")
    p.add_argument("--name", default="cpu-transfer-load", help="file name after the date")
    p.add_argument("--merge", action="store_true", help="keep the other kinds' rows of the day's file")
    args = p.parse_args(argv)
    quick = args.quick
    kinds = (args.kinds or ("tiny" if quick else ",".join(FULL_KINDS))).split(",")
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise SystemExit(f"--kinds: unknown {bad}; expected some of {sorted(KINDS)}")
    levels = _levels(args.levels) if args.levels else ([(2, 2)] if quick else list(FULL_LEVELS))
    overrides: dict[str, Any] = {"window": args.window, "claim_idle_s": 1.0 if quick else args.claim_idle,
                                 "abandon_every": 4 if quick else args.abandon_every}
    if quick:
        overrides.update(train_batch=16)
    duration, warmup = (2.0, 0.5) if quick else (args.duration, args.warmup)
    path = None
    if args.out or not quick:
        out = Path(args.out or "benchmarks/results")
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{date.today()}-{args.name}.json"
    old = json.loads(path.read_text()) if args.merge and path is not None and path.exists() else None
    machine = {"cpus": os.cpu_count(), "load_average": os.getloadavg(), "note": args.machine,
               "redis": _redis_version()}
    command = "python -m benchmarks.transfer_load " + " ".join(argv if argv is not None else sys.argv[1:])

    def result_of(rows: list[dict], verdict: dict) -> dict:
        result = {
            "date": str(date.today()), "command": command, "machine": machine,
            "columns": {"samples_per_s": "first deliveries to reward consumers per second in the window",
                        "mb_per_s": "samples/s x stored bytes per sample (10^6 B)",
                        "redis_cpu": "cores of redis-server's CPU time over the window",
                        "redis_cpu_s_per_sample": "Redis CPU seconds per sample of the window",
                        "commands_per_sample": "commands per sample, those the Lua scripts run included",
                        "latency": "reward consume time - publish start (ms)"},
            "rows": rows, "saturation": verdict, "calibration": fit_calibration(rows),
        }
        return _merged(old, result) if old is not None else result

    def write(rows: list[dict], verdict: dict) -> None:
        if path is not None:
            path.write_text(json.dumps(result_of(rows, verdict), indent=1))

    print(HEADER, flush=True)
    rows, verdict = sweep(kinds, levels, actors=args.actors if args.actors else (1 if quick else None),
                          duration_s=duration, warmup_s=warmup, saturation=args.saturation,
                          budget_s=args.budget_s, after_row=write, keep_going=args.keep_going, **overrides)
    result = result_of(rows, verdict)
    for kind, v in verdict.items():
        print(f"{kind}: {v['stopped']}; best {v['max_samples_per_s'] or 0:.1f} samples/s "
              f"({v['max_mb_per_s'] or 0:.0f} MB/s) at {v['at']}; one Redis core carries "
              f"{v['one_core_samples_per_s'] or 0:.0f} samples/s of this kind")
    cal = result["calibration"]
    if cal["s_per_sample"] is not None:
        print(f"calibration: Redis CPU = {cal['s_per_sample'] * 1e6:.0f} µs per sample + {cal['s_per_byte'] * 1e9:.3f} "
              f"ns per network byte ({cal['runs']} runs, r² {cal['r2'] if cal['r2'] is None else round(cal['r2'], 3)})")
    if path is not None:
        write(rows, verdict)
        print(f"wrote {path}")
    return result


def _merged(old: dict, new: dict) -> dict:
    """`new` with the rows and verdicts of `old`'s other kinds kept; the calibration refitted over all rows."""
    kinds = {r["kind"] for r in new["rows"]}
    rows = [r for r in old["rows"] if r["kind"] not in kinds] + new["rows"]
    saturation = {k: v for k, v in old["saturation"].items() if k not in kinds} | new["saturation"]
    commands = [c for c in old.get("commands", [old["command"]]) if c != new["command"]] + [new["command"]]
    return {**new, "command": new["command"], "commands": commands, "rows": rows, "saturation": saturation,
            "calibration": fit_calibration(rows)}


def _redis_version() -> str:
    server = start_redis_server()
    try:
        return str(redis.Redis.from_url(server.url).info("server")["redis_version"])
    finally:
        server.stop()


if __name__ == "__main__":
    main()
