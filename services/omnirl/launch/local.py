"""`omnirl run JOB.yaml`: the whole job on one machine.

An embedded `redis-server` when the manifest names none; each role (rollout ×R, reward ×R, actor,
controller) as its own process running `omnirl role …` — exactly what a pod runs — placed by Ray
(a local instance by default, `--ray-address` for a cluster) or as plain subprocesses
(`--no-ray`). Logs stream with a role prefix; a progress bar follows `OUT/metrics.jsonl`. Roles
are supervised per `failurePolicy` (`omnirl.launch.supervise`); Ctrl-C or a failure the policy
gives up on stops everything; the exit code is non-zero and names the role and reason.

Outputs: `OUT/job.yaml` (the resolved manifest the roles read), `OUT/metrics.jsonl`,
`OUT/samples/step-*.png`, `OUT/checkpoints/latest/`, `OUT/ledger/`, `OUT/logs/<role>.log`.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import yaml

from omnirl.api.loader import dump_rljob, load_rljob
from omnirl.api.runtime import VARIABLES, RoleEnv
from omnirl.api.spec import RLJob
from omnirl.launch.placement import Placement, describe, place, role_plan, weight_sync_backend
from omnirl.launch.procs import start_role
from omnirl.launch.progress import validation_table
from omnirl.launch.servers import JudgeFailed, check_local, start_judges, stop_judges
from omnirl.launch.supervise import Supervisor
from omnirl.transfer import TransferQueue, start_redis_server
from omnirl.transfer.redis_server import free_port


def role_env(job: RLJob, place: Placement, *, redis_url: str, sync_port: int, out: Path, resume: str,
             steps: int | None, dist_port: int = 0, sync_backend: str = "") -> dict[str, str]:
    """The environment of one local role process: `RoleEnv.to_environ()` (the contract pods get
    too), with `place`'s device, threads and visible accelerators; `resume` is an OMNIRL_RESUME
    mode ("0", "1", "auto"). The controller serves `/metrics` on `OMNIRL_METRICS_PORT` when
    `omnirl run`'s own environment sets it (the only role-process variable a user sets locally).

    Raises:
        ValueError: OMNIRL_METRICS_PORT is not an integer.
    """
    port = os.environ.get(VARIABLES["metrics_port"], "0") if place.role == "controller" else "0"
    if not port.isdigit():
        raise ValueError(f"{VARIABLES['metrics_port']}={port!r}: must be a port number (the controller's /metrics)")
    world = job.spec.roles.actor.replicas
    ranks = {"rank": place.index, "world_size": world, "master_port": dist_port} if place.role == "actor" and world > 1 else {}
    contract = RoleEnv(job_name=job.metadata.name, redis_url=redis_url, weight_sync_host="127.0.0.1",
                       weight_sync_port=sync_port, worker_id=place.name, out_dir=str(out), metrics_port=int(port),
                       device=place.device,
                       threads=place.threads, weight_sync_backend=sync_backend, resume=resume, steps=steps, **ranks)
    return {
        **contract.to_environ(), **place.environ(), "PYTHONUNBUFFERED": "1",
        # c10d logs a C++ stack trace as a *warning* when a peer's store closes at shutdown
        "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"),
    }


def main(args: argparse.Namespace) -> int:
    """Run a job locally; returns the exit code (0 = finished)."""
    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps {args.steps}: must be >= 1 (the total number of training steps)")
    if args.ray_address and not args.no_ray:
        from omnirl.launch.procs import check_ray_address

        check_ray_address(args.ray_address)  # before anything is started that would need stopping
    job = load_rljob(args.job)
    _check_local_paths(job)
    placements = place(job, device=getattr(args, "device", "auto"), share=getattr(args, "share_gpus", False))
    backend = weight_sync_backend(placements)
    out = Path(args.out or Path("runs") / job.metadata.name).resolve()
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: is a file, not a directory; choose a directory for the run's outputs")
    if not args.resume and (out / "metrics.jsonl").exists():
        raise ValueError(f"{out} already holds a run: pass --resume to continue it, or choose another --out")
    if args.resume and not (out / "metrics.jsonl").exists():
        raise ValueError(f"--resume: {out} holds no run to continue (no metrics.jsonl)")
    if args.resume:
        _check_same_job(job, out)
        total, trained = args.steps or job.spec.algorithm.steps, _trained_steps(out)
        if trained >= total:  # nothing would run: say so instead of starting every role for nothing
            print(f"omnirl: {out} has trained {trained} steps, the job asks for {total} "
                  f"({'--steps' if args.steps else 'spec.algorithm.steps'}): nothing to do; pass --steps N "
                  f"(N > {trained}) to train further", flush=True)
            return 0
    if job.spec.transferQueue.redisUrl:
        _check_redis(job.spec.transferQueue.redisUrl)
    check_local(job)  # judge servers this machine cannot run (launch/servers.py)
    out.mkdir(parents=True, exist_ok=True)
    lock = _lock_run_dir(out)  # held until this process exits (the kernel drops it even on SIGKILL)
    (out / "job.yaml").write_text(yaml.safe_dump(dump_rljob(job), sort_keys=False))
    redis, judges = None, []
    redis_url = job.spec.transferQueue.redisUrl
    if not redis_url:  # AOF on: the supervisor restarts it on the same port and directory if it dies
        redis = start_redis_server(dir=str(out / "redis"), aof=True)
        redis_url = redis.url
    queue = TransferQueue.for_job(job.metadata.name, job.spec.transferQueue, redis_url)
    if not args.resume:
        queue.cleanup()  # a fresh run starts from empty streams
    else:
        for flag in ("stop", "actor_ready"):
            queue.redis.delete(f"omnirl:{job.metadata.name}:kv:{flag}")
    sync_port, dist_port = free_port(), free_port()
    supervisor = None
    ray_ctx = None
    if not args.no_ray:
        from omnirl.launch.procs import init_ray

        ray_ctx = init_ray(args.ray_address)
    print(f"omnirl: job {job.metadata.name} → {out} (redis {redis_url}, {'ray' if ray_ctx else 'subprocesses'})",
          flush=True)
    print(describe(placements, backend), flush=True)
    where = {(p.role, p.index): p for p in placements}

    def start(role: str, index: int, resume: str):
        env = role_env(job, where[role, index], redis_url=redis_url, sync_port=sync_port, out=out,
                       resume=resume, steps=args.steps, dist_port=dist_port, sync_backend=backend)
        return start_role(role, index, out / "job.yaml", env, out / "logs", use_ray=ray_ctx is not None)

    old = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        judges, wired = start_judges(job, out / "logs")  # reward[].server: local processes, URLs wired in
        (out / "job.yaml").write_text(yaml.safe_dump(dump_rljob(wired), sort_keys=False))
        supervisor = Supervisor(job, role_plan(job), start, queue, out, args.steps or job.spec.algorithm.steps,
                                resume="1" if args.resume else "0", redis=redis)
        code = supervisor.run()
        redis = supervisor.redis  # it may have restarted the server
        if code == 0:
            queue.set_json("stop", True)  # the controller set it already; every role exits 0
            supervisor.stop_all(grace_s=20.0)
    except KeyboardInterrupt:
        print("omnirl: interrupted — stopping every role (the actor writes a checkpoint; --resume continues)",
              flush=True)
        code = 130
    except JudgeFailed as err:
        print(f"omnirl: {err}", flush=True)
        code = 1
    finally:
        signal.signal(signal.SIGTERM, old)
        if supervisor is not None:
            redis = supervisor.redis
            supervisor.stop_all()
            supervisor.close()
        stop_judges(judges)
        queue.close()
        if redis is not None:
            redis.stop()
    _summary(out)
    lock.close()
    return code


def _check_local_paths(job: RLJob) -> None:
    """The files a local run reads, checked before any process starts (a pod's paths are the
    operator's business: `omnirl validate` does not require them on this machine).

    Raises:
        FileNotFoundError: naming the field and the missing path.
    """
    spec = job.spec
    paths = [("spec.data.trainPrompts", spec.data.trainPrompts),
             ("spec.data.validationPrompts", spec.data.validationPrompts)]
    if spec.model.path != "builtin":
        paths.append(("spec.model.path", spec.model.path))
    for field, path in paths:
        if path and not Path(path).exists():
            raise FileNotFoundError(f"{field}: {path} does not exist on this machine; point it at a local "
                                    "file or directory (relative paths resolve against the manifest's folder)")
    _check_prompts(job)


def _check_prompts(job: RLJob) -> None:
    """Tokenize the prompts the controller will (the training file, the validated head of the
    validation file) before any process starts: a prompt the model cannot take would otherwise fail
    the controller at start, be retried by every `restart-job`, and end the job after minutes.

    Raises:
        ValueError: naming the field, the file and line, the tokenizer's reason and the fix.
    """
    from omnirl.controller.data import check_prompts
    from omnirl.models.registry import load_tokenizer

    spec = job.spec
    tokenize = load_tokenizer(spec.model.family, spec.model.path)
    check_prompts(spec.data.trainPrompts, tokenize, "spec.data.trainPrompts")
    if spec.data.validationPrompts:
        check_prompts(spec.data.validationPrompts, tokenize, "spec.data.validationPrompts", spec.validation.maxPrompts)


def _lock_run_dir(out: Path) -> IO[str]:
    """An exclusive lock on `out/launcher.lock` for this launcher's life: a second `omnirl run` on the
    same directory (e.g. `--resume` typed while the run is still going) would start its own Redis on
    the same append-only file and a second actor writing the same checkpoints.

    Raises:
        ValueError: another live `omnirl run` holds it, naming its pid and the fix.
    """
    handle = (out / "launcher.lock").open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        pid = handle.read().strip() or "?"
        handle.close()
        raise ValueError(f"--out {out}: another omnirl run (pid {pid}) is running in this directory; wait for it "
                         "or stop it (Ctrl-C), then --resume, or choose another --out") from None
    handle.truncate(0)
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def _check_redis(url: str) -> None:
    """The manifest's own Redis must answer before any role starts: the roles' clients retry for
    minutes (to ride out a restart), so an unreachable URL would otherwise look like a silent hang.

    Raises:
        ValueError: naming `spec.transferQueue.redisUrl`, the host and port (never the password) and the fix.
    """
    import redis as redis_py

    parts = urlsplit(url)
    try:
        with redis_py.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5) as client:
            client.ping()
    except (redis_py.RedisError, OSError, ValueError) as err:
        raise ValueError(f"spec.transferQueue.redisUrl: {parts.hostname}:{parts.port or 6379} does not answer "
                         f"({type(err).__name__}: {err}); start that Redis or fix the URL, or remove redisUrl so "
                         "omnirl run starts its own redis-server") from err


def _trained_steps(out: Path) -> int:
    """Training steps with a line in `out/metrics.jsonl` (the highest step + 1; 0 for none)."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return max((int(r["step"]) for r in records if r.get("event") == "step"), default=-1) + 1


def _check_same_job(job: RLJob, out: Path) -> None:
    """`--resume` continues the run in `out` only with that run's job: its name (the Redis key prefix
    of its pending work), algorithm and model family, as recorded in `out/job.yaml`.

    Raises:
        ValueError: naming the field, both values and the fix.
    """
    path = out / "job.yaml"
    if not path.exists():
        return
    before = yaml.safe_load(path.read_text()) or {}
    fields = (("metadata.name", job.metadata.name, ("metadata", "name")),
              ("spec.algorithm.name", job.spec.algorithm.name, ("spec", "algorithm", "name")),
              ("spec.model.family", job.spec.model.family, ("spec", "model", "family")))
    for field, now, keys in fields:
        was: object = before
        for key in keys:
            was = was.get(key) if isinstance(was, dict) else None
        if was is not None and was != now:
            raise ValueError(f"--resume: {out} holds a run with {field} {was!r}, not {now!r}; resume it with its own "
                             "manifest, or start a new run (another --out) with model.path: OUT/exports/latest")


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the job like Ctrl-C


def _summary(out: Path) -> None:
    path = out / "metrics.jsonl"
    if not path.exists():
        return
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    table = validation_table(records)
    if table:
        print(table, flush=True)
