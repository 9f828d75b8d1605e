"""`omnirl run JOB.yaml`: the whole job on one machine.

An embedded `redis-server` when the manifest names none; each role (rollout ×R, reward ×R, actor,
controller) as its own process running `omnirl role …` — exactly what a pod runs — placed by Ray
(a local instance by default, `--ray-address` for a cluster) or as plain subprocesses
(`--no-ray`). Logs stream with a role prefix; a progress bar follows `OUT/metrics.jsonl`. Ctrl-C
or a failing role stops everything; the exit code is non-zero and names the role and reason.

Outputs: `OUT/job.yaml` (the resolved manifest the roles read), `OUT/metrics.jsonl`,
`OUT/samples/step-*.png`, `OUT/checkpoints/latest/`, `OUT/ledger/`, `OUT/logs/<role>.log`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import yaml

from omnirl.api.loader import dump_rljob, load_rljob
from omnirl.api.spec import RLJob
from omnirl.launch.procs import RoleProcess, start_role
from omnirl.launch.progress import Progress, validation_table
from omnirl.transfer import TransferQueue, start_redis_server
from omnirl.transfer.redis_server import free_port


def role_threads(role: str, mode: str, cores: int) -> int:
    """torch threads of a local role. In `sync`/`async-reward` the rollout and the actor take turns,
    so each may use every core; in `fully-async` they run at once and split the cores (threads
    beyond the cores spin against each other: 4× slower steps measured on 2 cores)."""
    if role in ("reward", "controller"):
        return 1
    return max(1, cores // 2) if mode == "fully-async" else max(1, cores)


def role_plan(job: RLJob) -> list[tuple[str, int]]:
    """(role, replica index) for every process of the job, controller last."""
    r = job.spec.roles
    plan = [("rollout", i) for i in range(r.rollout.replicas)]
    plan += [("reward", i) for i in range(r.reward.replicas)]
    return plan + [("actor", i) for i in range(r.actor.replicas)] + [("controller", 0)]


def role_env(job: RLJob, role: str, index: int, *, redis_url: str, sync_port: int, out: Path,
             resume: bool, steps: int | None, dist_port: int = 0) -> dict[str, str]:
    """The OMNIRL_* environment of one local role process (the same contract pods get)."""
    threads = role_threads(role, job.spec.pipeline.mode, os.cpu_count() or 1)
    env = {
        "OMNIRL_JOB_NAME": job.metadata.name, "OMNIRL_REDIS_URL": redis_url,
        "OMNIRL_WEIGHT_SYNC_ADDR": f"127.0.0.1:{sync_port}", "OMNIRL_WORKER_ID": f"{role}-{index}",
        "OMNIRL_OUT": str(out), "OMNIRL_THREADS": str(threads), "OMNIRL_RESUME": "1" if resume else "0",
        "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
        # c10d logs a C++ stack trace as a *warning* when a peer's store closes at shutdown
        "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"),
    }
    if steps is not None:
        env["OMNIRL_STEPS"] = str(steps)
    world = job.spec.roles.actor.replicas
    if role == "actor" and world > 1:  # the actor ranks' rendezvous, as the operator gives pods
        env.update(RANK=str(index), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(dist_port))
    return env


def main(args: argparse.Namespace) -> int:
    """Run a job locally; returns the exit code (0 = finished)."""
    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps {args.steps}: must be >= 1 (the total number of training steps)")
    if args.ray_address and not args.no_ray:
        from omnirl.launch.procs import check_ray_address

        check_ray_address(args.ray_address)  # before anything is started that would need stopping
    job = load_rljob(args.job)
    out = Path(args.out or Path("runs") / job.metadata.name).resolve()
    if not args.resume and (out / "metrics.jsonl").exists():
        raise ValueError(f"{out} already holds a run: pass --resume to continue it, or choose another --out")
    if args.resume and not (out / "metrics.jsonl").exists():
        raise ValueError(f"--resume: {out} holds no run to continue (no metrics.jsonl)")
    out.mkdir(parents=True, exist_ok=True)
    (out / "job.yaml").write_text(yaml.safe_dump(dump_rljob(job), sort_keys=False))
    redis = None
    redis_url = job.spec.transferQueue.redisUrl
    if not redis_url:
        redis = start_redis_server(dir=str(out / "redis"))
        redis_url = redis.url
    queue = TransferQueue.from_url(redis_url, job.metadata.name)
    if not args.resume:
        queue.cleanup()  # a fresh run starts from empty streams
    else:
        for flag in ("stop", "actor_ready"):
            queue.redis.delete(f"omnirl:{job.metadata.name}:kv:{flag}")
    sync_port, dist_port = free_port(), free_port()
    procs: list[RoleProcess] = []
    ray_ctx = None
    if not args.no_ray:
        from omnirl.launch.procs import init_ray

        ray_ctx = init_ray(args.ray_address)
    print(f"omnirl: job {job.metadata.name} → {out} (redis {redis_url}, {'ray' if ray_ctx else 'subprocesses'})",
          flush=True)
    try:
        for role, index in role_plan(job):
            env = role_env(job, role, index, redis_url=redis_url, sync_port=sync_port, out=out,
                           resume=args.resume, steps=args.steps, dist_port=dist_port)
            procs.append(start_role(role, index, out / "job.yaml", env, out / "logs", use_ray=ray_ctx is not None))
        code = _supervise(procs, queue, out, job, args.steps or job.spec.algorithm.steps)
    except KeyboardInterrupt:
        print("omnirl: interrupted — stopping every role", flush=True)
        code = 130
    finally:
        queue.set_json("stop", True)
        _stop_all(procs)
        queue.close()
        if redis is not None:
            redis.stop()
    _summary(out)
    return code


def _supervise(procs: list[RoleProcess], queue: TransferQueue, out: Path, job: RLJob, total: int) -> int:
    controller = next(p for p in procs if p.role == "controller")
    progress = Progress(out / "metrics.jsonl", total)
    old = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        while True:
            for p in procs:
                p.pump_logs(sys.stdout)
            progress.update()
            code = controller.poll()
            if code is not None:
                progress.close()
                if code != 0:
                    print(f"omnirl: role controller failed (exit {code}): {controller.last_error()}", flush=True)
                return code
            for p in procs:
                c = p.poll()
                if c is None or p is controller or (c == 0 and queue.get_json("stop")):
                    continue  # running, or finished because the controller ended the job
                progress.close()
                why = p.last_error() if c else "exited before the job finished"
                print(f"omnirl: role {p.name} failed (exit {c}): {why}", flush=True)
                if c < 0:  # killed by signal N: 128 + N, as a shell reports it
                    return 128 - c
                return c or 1
            time.sleep(0.2)
    finally:
        signal.signal(signal.SIGTERM, old)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the job like Ctrl-C


def _stop_all(procs: list[RoleProcess], grace_s: float = 20.0) -> None:
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        for p in procs:
            p.pump_logs(sys.stdout)
        time.sleep(0.2)
    for p in procs:
        p.pump_logs(sys.stdout)
        p.kill()


def _summary(out: Path) -> None:
    path = out / "metrics.jsonl"
    if not path.exists():
        return
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    table = validation_table(records)
    if table:
        print(table, flush=True)
