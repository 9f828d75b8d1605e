"""`omnirl run JOB.yaml`: the whole job on one machine.

An embedded `redis-server` when the manifest names none; each role (rollout ×R, reward ×R, actor,
controller) as its own process running `omnirl role …` — exactly what a pod runs — placed by Ray
(a local instance by default, `--ray-address` for a cluster) or as plain subprocesses
(`--no-ray`). Logs stream with a role prefix; a progress bar follows `OUT/metrics.jsonl`. Roles
are supervised per `failurePolicy` (`omnirl.launch.supervise`); Ctrl-C or a failure the policy
gives up on stops everything; the exit code is non-zero and names the role and reason.

Outputs: `OUT/job.yaml` (the resolved manifest, judge servers as written: what `omnirl eval` and
`--resume` read), `OUT/job-roles.yaml` (the one the roles read: each `reward[].server` replaced by
the `url` of the judge this launcher started, dead once the run ends), `OUT/metrics.jsonl`,
`OUT/samples/step-*.png`, `OUT/checkpoints/latest/`, `OUT/ledger/`, `OUT/logs/<role>.log`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from omnirl.api.exits import CONFIG_ERROR_EXIT, DONE, FAILED, INTERRUPTED_EXIT, STORAGE_ERROR_EXIT
from omnirl.api.loader import dump_rljob, load_rljob
from omnirl.api.run_dir import METRICS_FILE, finished, read_metrics, trained_steps
from omnirl.api.runtime import VARIABLES, RoleEnv, port_number
from omnirl.api.spec import RLJob
from omnirl.api.spec_parallel import actor_world
from omnirl.launch import preflight
from omnirl.launch.placement import Placement, describe, place, role_plan, weight_sync_backend
from omnirl.launch.procs import start_role
from omnirl.launch.progress import finish_summary, validation_table
from omnirl.launch.supervise import STATELESS_GRACE_S, Supervisor, clear_start_flags
from omnirl.reward.registry import check_judges
from omnirl.reward.servers import JudgeFailed, check_local, check_served_judges, start_judges, stop_judges
from omnirl.system import disk
from omnirl.transfer import RedisServerError, TransferQueue, start_redis_server
from omnirl.transfer.owner import LIVE_BEAT_S, RUN_OWNER
from omnirl.transfer.redis_server import free_port

ROLES_MANIFEST = "job-roles.yaml"  # OUT/job.yaml with this run's judge URLs wired in: what the roles read


def role_env(job: RLJob, place: Placement, *, redis_url: str, sync_port: int, out: Path, resume: str,
             steps: int | None, dist_port: int = 0, sync_backend: str = "",
             replica_ports: list[int] | tuple[int, ...] = ()) -> dict[str, str]:
    """The environment of one local role process: `RoleEnv.to_environ()` (the contract pods get
    too), with `place`'s device, threads and visible accelerators; `resume` is an OMNIRL_RESUME
    mode ("0", "1", "auto"). The controller serves `/metrics` on `OMNIRL_METRICS_PORT` when
    `omnirl run`'s own environment sets it (the only role-process variable a user sets locally).

    Raises:
        ConfigError: OMNIRL_METRICS_PORT is no port number (`shell_metrics_port`).
    """
    port = shell_metrics_port() if place.role == "controller" else 0
    roles = job.spec.roles
    world = actor_world(roles.actor.replicas, roles.actor.parallel)
    worker = place.name
    ranks = {"rank": place.index, "world_size": world, "master_port": dist_port} if place.role == "actor" and world > 1 else {}
    per_replica = roles.rollout.parallel.ranks
    if place.role == "rollout" and per_replica > 1:  # rank index % R of replica index // R, meeting at its own port
        replica = place.index // per_replica
        worker = f"rollout-{replica}"
        ranks = {"rank": place.index % per_replica, "world_size": per_replica, "master_port": replica_ports[replica]}
    contract = RoleEnv(job_name=job.metadata.name, redis_url=redis_url, weight_sync_host="127.0.0.1",
                       weight_sync_port=sync_port, worker_id=worker, out_dir=str(out), metrics_port=port,
                       device=place.device,
                       threads=place.threads, weight_sync_backend=sync_backend, resume=resume, steps=steps,
                       manifest=str(out / "job.yaml"), **ranks)  # as written, beside ROLES_MANIFEST: exports carry it
    return {
        **contract.to_environ(), **place.environ(), "PYTHONUNBUFFERED": "1",
        # c10d logs a C++ stack trace as a *warning* when a peer's store closes at shutdown
        "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"),
    }


def autoscale_note(job: RLJob) -> str | None:
    """The line `omnirl run` prints for a job with `roles.reward.autoscale`, which only the operator acts
    on (it scales the reward Deployment by the samples backlog): a local run keeps `roles.reward.replicas`
    workers, said once at start instead of silently. None without autoscale."""
    auto, reward = job.spec.roles.reward.autoscale, job.spec.roles.reward
    if auto is None:
        return None
    workers = f"{reward.replicas} reward worker{'s' if reward.replicas != 1 else ''}"
    return (f"omnirl: roles.reward.autoscale ({auto.minReplicas}–{auto.maxReplicas} workers by the samples backlog) "
            f"is for Kubernetes, where the operator scales the reward Deployment; this local run keeps "
            f"roles.reward.replicas: {workers} throughout")


def shell_metrics_port() -> int:
    """The controller's /metrics port from `omnirl run`'s own OMNIRL_METRICS_PORT (0 = none).

    Raises:
        ConfigError: no port number (`omnirl.api.runtime.port_number`); `_run` asks first, so a bad
            value is refused before anything starts.
    """
    return port_number("metrics_port", os.environ.get(VARIABLES["metrics_port"], ""))


def main(args: argparse.Namespace) -> int:
    """Run a job locally; returns the exit code (`omnirl.api.exits`: `DONE` finished, `INTERRUPTED_EXIT` interrupted).

    Ctrl-C or SIGTERM at any point — the pre-flight checks, Redis or Ray starting, the roles
    running — stops whatever was started and ends with the same last line (`verdict`); so does a
    launcher write to the run directory that fails for want of space (exit `STORAGE_ERROR_EXIT`).
    """
    old = signal.signal(signal.SIGTERM, _raise_interrupt)  # SIGTERM stops the job like Ctrl-C, from the start
    # "out": the run directory, once known; "records": how many records its metrics.jsonl held before the roles
    # started (`verdict`: only the controllers of this launcher can have finished the job it was asked for)
    started: dict[str, Path | int] = {}
    try:
        return _run(args, started)
    except KeyboardInterrupt:  # before the roles' supervision began: nothing is left running (see _run)
        out = Path(started.get("out") or args.out or "runs/<job>")
        print(verdict(INTERRUPTED_EXIT, "", args, out, since=started.get("records")), flush=True)
        return INTERRUPTED_EXIT
    except OSError as raised:  # the launcher's own write (job.yaml, a log) after the pre-flight probe passed
        err = disk.storage_error(raised)
        if err is None or "out" not in started:
            raise
        what, fix = disk.failure(err, started["out"])
        print(verdict(STORAGE_ERROR_EXIT, f"{what}; {fix}", args, Path(started["out"])), flush=True)
        return STORAGE_ERROR_EXIT
    finally:
        signal.signal(signal.SIGTERM, old)


@dataclass
class _Launch:
    """One `omnirl run` as its phases build it: the checked job and run directory, then what was started (the
    cleanup phase stops exactly what is set here, whichever phase failed)."""

    args: argparse.Namespace
    job: RLJob
    out: Path
    placements: list[Placement]
    backend: str
    lock: object  # the run directory's lock (`preflight.lock_run_dir`), held until the launcher exits
    since: int = 0  # records `out/metrics.jsonl` held before the roles started
    redis: object = None  # the embedded RedisServer, or None for the manifest's Redis
    redis_url: str = ""
    queue: TransferQueue | None = None
    claim: object = None  # this run's claim of the job's name on the manifest's Redis (`preflight.RunClaim`)
    ports: tuple[int, int] = (0, 0)  # the weight-sync store's and the actor ranks' rendezvous
    replica_ports: list[int] = field(default_factory=list)  # each rollout replica's ranks' rendezvous
    ray_ctx: object = None
    judges: list = field(default_factory=list)
    supervisor: Supervisor | None = None

    @property
    def total(self) -> int:
        """The run's total training steps (`--steps`, else `spec.algorithm.steps`)."""
        return self.args.steps or self.job.spec.algorithm.steps


def _run(args: argparse.Namespace, started: dict[str, Path | int]) -> int:
    """`omnirl run`'s phases, in order: the pre-flight checks (nothing started yet), the run directory, Redis and
    the job's queue, Ray, the judge servers, the supervised roles; then, whatever happened, the stop and clean-up
    and the closing report."""
    launch = _check_before_starting(args, started)
    if isinstance(launch, int):
        return launch  # a finished run's --resume: nothing to do
    _write_run_dir(launch)
    failure, code = "", FAILED
    try:
        _open_queue(launch)
        _start_ray(launch)
        _say_what_runs(launch)
        _start_judges(launch)
        code = _supervise(launch)
    except KeyboardInterrupt:
        print(interrupt_line(launch.out, launch.since, started=launch.supervisor is not None, resume=args.resume,
                             total=launch.total), flush=True)
        code = INTERRUPTED_EXIT
    except JudgeFailed as err:  # its log's tail, then the verdict names the field, what happened and the fix
        if err.tail:
            print(f"omnirl: judge {err.reward}: the last lines of {err.log}:", flush=True)
            print("\n".join(f"  {line}" for line in err.tail), flush=True)
        # a setting the job cannot start with (spec.reward[i].server), as a role's at start-up: CONFIG_ERROR_EXIT, not
        # restarted; the operator fails the RLJob for it too (JudgeFailed), so a script reads one code for both
        failure, code = str(err), CONFIG_ERROR_EXIT
    except RedisServerError as err:  # the embedded server exited at start (its log's tail follows the first line)
        first, _, tail = str(err).partition("\n")
        if tail.strip():
            print(tail.rstrip(), flush=True)
        failure, code = f"the embedded Redis did not start: {first}", FAILED
    finally:
        failure = _stop_and_clean_up(launch, code, failure)
    _report(launch, code, failure)
    return code


def _check_before_starting(args: argparse.Namespace, started: dict[str, Path | int]) -> _Launch | int:
    """The pre-flight phase: every check that can fail before anything is started (the manifest, placement, local
    paths, judges, the run directory and its lock, `--resume`'s run, the manifest's Redis). Returns the launch, or
    0 for a `--resume` of a finished run with nothing to do (said, the keys it left on the manifest's Redis
    cleared). Sets `started["out"]` and `started["records"]` for `main`'s last line.

    Raises:
        ValueError, ConfigError: a setting the run cannot start with (one line; `omnirl run` exits 2).
    """
    shell_metrics_port()  # refused here, not after Redis and the placement table (the controller's env reads it)
    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps {args.steps}: must be >= 1 (the total number of training steps)")
    if args.ray_address and not args.no_ray:
        from omnirl.launch.procs import check_ray_address

        check_ray_address(args.ray_address)  # before anything is started that would need stopping
    job = load_rljob(args.job)
    placements = place(job, device=getattr(args, "device", "auto"), share=getattr(args, "share_gpus", False))
    preflight.check_attention(job, placements)
    preflight.check_local_paths(job)
    preflight.check_redis_server(job)
    if not args.resume:  # the judges of reward[].url; those of reward[].server once they answer
        check_judges(job.spec.reward)
    backend = weight_sync_backend(placements)
    out = Path(args.out or Path("runs") / job.metadata.name).resolve()
    started["out"] = out
    disk.check_writable(out)  # read-only, full, under a file: one line now, not a traceback later
    # a live launcher here is named before "pass --resume" or "nothing to do", which would mislead
    lock = preflight.lock_run_dir(out) if out.is_dir() else None
    if not args.resume and holds_run(out):
        preflight.check_same_job(job, out, flag="--out")  # another job's run: --resume is no fix either
        raise ValueError(f"{out} already holds a run: pass --resume to continue it, or choose another --out")
    if args.resume and not (out / METRICS_FILE).exists():
        raise ValueError(f"--resume: {out} holds no run to continue (no metrics.jsonl); drop --resume to start a "
                         "fresh run there, or pass the --out of the run to continue")
    if args.resume:
        note = preflight.check_same_job(job, out)
        if note:
            print(f"omnirl: --resume: {note}", flush=True)
        # how far it got: its highest step with a line, + 1
        total, trained = args.steps or job.spec.algorithm.steps, max(trained_steps(out), default=-1) + 1
        # nothing would run: say so instead of starting every role for nothing; a run stopped after its
        # last step but before its final validation and export still starts, for those
        if trained >= total and finished(out):
            print(f"omnirl: {out} has trained {trained} steps, the job asks for {total} "
                  f"({'--steps' if args.steps else 'spec.algorithm.steps'}): nothing to do; pass --steps N "
                  f"(N > {trained}) to train further", flush=True)
            if job.spec.transferQueue.redisUrl:  # leave that Redis as the finished run does (the embedded one is
                # this --out's own: its finished run leaves it as it is too)
                cleared = preflight.clear_finished(job.spec.transferQueue.redisUrl, job, out)
                if cleared:
                    print(f"omnirl: {cleared}", flush=True)
            lock.close()
            return 0
    if args.resume:  # after its checks: a judge the resumed run may not use is refused as such, not as silent
        check_judges(job.spec.reward)
    started["records"] = len(read_metrics(out)) if args.resume else 0  # a fresh run holds none
    if job.spec.transferQueue.redisUrl:  # the embedded Redis is this --out's own, and the lock guards it
        preflight.check_redis(job.spec.transferQueue.redisUrl)
        # read only, to fail before anything starts; the claim below decides again, atomically
        preflight.check_not_running_elsewhere(job.spec.transferQueue.redisUrl, job, None if args.resume else out, out)
    check_local(job)  # judge servers this machine cannot run (reward/servers.py)
    return _Launch(args, job, out, placements, backend, lock, since=int(started["records"]))


def _write_run_dir(launch: _Launch) -> None:
    """The run directory phase: create it, hold its lock, write the manifest as written (`OUT/job.yaml`)."""
    launch.out.mkdir(parents=True, exist_ok=True)
    # held until this process exits (the kernel drops it even on SIGKILL)
    launch.lock = launch.lock or preflight.lock_run_dir(launch.out)
    (launch.out / "job.yaml").write_text(yaml.safe_dump(dump_rljob(launch.job), sort_keys=False))


def _open_queue(launch: _Launch) -> None:
    """The Redis phase: the embedded `redis-server` (AOF on: the supervisor restarts it on the same port and
    directory if it dies) or the manifest's, the job's queue, this run's claim of the name on a shared Redis, and
    the job's keys made ready (a fresh run's emptied, a `--resume`'s start flags cleared)."""
    job = launch.job
    launch.redis_url = job.spec.transferQueue.redisUrl
    if not launch.redis_url:
        launch.redis = start_redis_server(dir=str(launch.out / "redis"), aof=True)
        launch.redis_url = launch.redis.url
    launch.queue = TransferQueue.for_job(job.metadata.name, job.spec.transferQueue, launch.redis_url)
    if job.spec.transferQueue.redisUrl:  # a shared Redis: claim the name before touching its keys (atomic:
        # another launcher or an operator claiming in the same instant is refused), renewed until the end
        launch.claim = preflight.claim_run(job.spec.transferQueue.redisUrl, job, launch.out,
                                           resume=bool(launch.args.resume))
    if not launch.args.resume:
        launch.queue.cleanup(keep=(RUN_OWNER,))  # a fresh run starts from empty streams, its claim kept
    else:
        clear_start_flags(launch.queue)


def _start_ray(launch: _Launch) -> None:
    """The Ray phase: this run's two ports (weight-sync store, actor ranks' rendezvous), then Ray unless `--no-ray`."""
    launch.ports = (free_port(), free_port())
    launch.replica_ports = [free_port() for _ in range(launch.job.spec.roles.rollout.replicas)]
    if not launch.args.no_ray:
        from omnirl.launch.procs import init_ray

        launch.ray_ctx = init_ray(launch.args.ray_address)


def _say_what_runs(launch: _Launch) -> None:
    """The lines that say where the job runs: the run directory and Redis, the placement table, a local run's
    note on `roles.reward.autoscale`."""
    print(f"omnirl: job {launch.job.metadata.name} → {launch.out} (redis {launch.redis_url}, "
          f"{'ray' if launch.ray_ctx else 'subprocesses'})", flush=True)
    print(describe(launch.placements, launch.backend), flush=True)
    note = autoscale_note(launch.job)
    if note:
        print(note, flush=True)


def _start_judges(launch: _Launch) -> None:
    """The judges phase: `reward[].server` as local processes, checked to answer, their URLs wired into the
    manifest the roles read (`OUT/job-roles.yaml`)."""
    launch.judges, wired = start_judges(launch.job, launch.out / "logs")
    check_served_judges(wired, launch.judges)
    # not over job.yaml: these URLs die with the run, and `omnirl eval OUT/job.yaml` then failed on one
    # (exit 2, "does not answer"); job.yaml keeps `server`, which eval serves itself
    (launch.out / ROLES_MANIFEST).write_text(yaml.safe_dump(dump_rljob(wired), sort_keys=False))


def _supervise(launch: _Launch) -> int:
    """The roles phase: start every role process and supervise them per `failurePolicy` until the job ends;
    returns the exit code. A finished job's roles are told to stop and given 20 s."""
    args, job, out = launch.args, launch.job, launch.out
    where = {(p.role, p.index): p for p in launch.placements}
    sync_port, dist_port = launch.ports

    def start(role: str, index: int, resume: str):
        env = role_env(job, where[role, index], redis_url=launch.redis_url, sync_port=sync_port, out=out,
                       resume=resume, steps=args.steps, dist_port=dist_port, sync_backend=launch.backend,
                       replica_ports=launch.replica_ports)
        return start_role(role, index, out / ROLES_MANIFEST, env, out / "logs", use_ray=launch.ray_ctx is not None)

    launch.supervisor = Supervisor(job, role_plan(job), start, launch.queue, out, launch.total,
                                   resume="auto" if args.resume else "0", redis=launch.redis, judges=launch.judges)
    code = launch.supervisor.run()
    launch.redis = launch.supervisor.redis  # it may have restarted the server
    if code == DONE:
        launch.queue.records.request_stop()  # the controller set it already; every role exits 0
        launch.supervisor.stop_all(grace_s=20.0)
    return code


def _stop_and_clean_up(launch: _Launch, code: int, failure: str) -> str:
    """The stop phase, whatever ended the run: the roles stopped (their grace cut short when the run directory or
    the manifest's Redis cannot be used), the claim, the job's keys on a shared Redis marked stopped or deleted,
    the judges, the queue, the embedded Redis and Ray. A second Ctrl-C cuts the stop short; it cannot skip the
    cleanup. Returns the run's failure: the supervisor's once it ran, else `failure`."""
    job, out, supervisor = launch.job, launch.out, launch.supervisor
    with _interrupts_hurry(supervisor):
        silent, forced = "", []  # why the manifest's Redis does not answer; the roles SIGKILLed after their grace
        try:
            if supervisor is not None:
                failure = supervisor.failure
                if job.spec.transferQueue.redisUrl:
                    silent = preflight.redis_silent(job.spec.transferQueue.redisUrl)
                # a full or read-only run directory: the actor's SIGTERM checkpoint cannot be written (nor, when
                # its Redis died of it, handed over); the last complete one stands, so no grace period is waited
                # out. Nor for a Redis gone away: the roles sit in its clients' retries, deaf to SIGTERM
                quick = code == STORAGE_ERROR_EXIT or bool(silent)
                forced = supervisor.stop_all(grace_s=STATELESS_GRACE_S if quick else None)
        finally:
            if launch.claim is not None:
                launch.claim.close()  # stop renewing: mark_stopped below marks the record stopped or deletes it
            if supervisor is not None:
                supervisor.close()
                launch.redis = supervisor.redis  # read after close: its watchdog may restart the server until then
            # nothing to continue when its controller never started, or finished the job (its `finish` record):
            # a Ctrl-C after the finish left its keys, stop flag and place, and a fresh run of the name was then
            # refused, told to --resume this one, whose --resume said "nothing to do" and left them
            done = code == DONE or not holds_run(out) or _finished_now(out, launch.since)
            if silent:  # the marks below would wait 5 s for nothing: say what is left instead
                print(left_behind(silent, job.metadata.name, forced, finished=done), flush=True)
            elif launch.claim is not None:  # its roles are stopped: the resume we print must not be refused as
                # "running" by their last beats (an embedded Redis is this --out's, not shared); nothing to
                # continue when its controller never started (or no role did): no place to keep, claim released
                why = preflight.mark_stopped(job.spec.transferQueue.redisUrl, job, out, finished=done)
                if why:
                    print(f"omnirl: {why}", flush=True)
            stop_judges(launch.judges)
            if launch.queue is not None:
                launch.queue.close()
            if launch.redis is not None:
                launch.redis.stop()
            if launch.ray_ctx is None and "ray" in sys.modules:  # interrupted in ray.init: stop what it started
                sys.modules["ray"].shutdown()
    return failure


def _report(launch: _Launch, code: int, failure: str) -> None:
    """The closing phase: the held-out table and a finished run's summary; for a run that did not finish, the last
    line says why and how to continue (`verdict`). Then the run directory's lock is released."""
    _summary(launch.out, launch.job.metadata.name, since=launch.since)
    if code:  # the table above reads like a finished run: the last line says it is not
        print(verdict(code, failure, launch.args, launch.out, since=launch.since), flush=True)
    launch.lock.close()


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the job like Ctrl-C


@contextlib.contextmanager
def _interrupts_hurry(supervisor: Supervisor | None) -> Iterator[None]:
    """While the launcher stops the job and cleans up, Ctrl-C or SIGTERM (again) calls `supervisor.hurry()`
    — the roles still running are SIGKILLed at once, as an impatient second Ctrl-C asks — instead of
    raising KeyboardInterrupt. Raised there, it skipped the rest of the cleanup: the embedded Redis and
    the Redis watchdog were never stopped, the watchdog restarted the server when the launcher's exit
    took it down, and a `redis-server` outlived `omnirl run`. Outside the main thread (no signal
    handlers there) it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def hurry(signum: int, frame: object) -> None:
        if supervisor is not None:
            supervisor.hurry()  # only a flag: stop_all says so from the main loop (no print inside a handler)

    before = {sig: signal.signal(sig, hurry) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def interrupt_line(out: Path, since: int, *, started: bool, resume: bool, total: int) -> str:
    """The launcher's line when Ctrl-C (or SIGTERM) stops a run, true for the phase it came in: before
    the roles started, while they loaded (no `start` record of this launch's controller among the
    records of `out`'s `metrics.jsonl` after the first `since`), while they trained, or after the job
    had finished (its `finish` record). It said "the actor writes a checkpoint" in every phase, also
    while the roles loaded and nothing was trained.

    Args:
        out: the run directory.
        since: how many records `metrics.jsonl` held before this launcher started the roles.
        started: whether the roles were started (the supervisor exists).
        resume: `--resume` (the run's earlier checkpoints stand).
        total: the run's total training steps.
    """
    kept = "the run's last checkpoint stands" if resume else "nothing to checkpoint"
    if not started:
        return f"omnirl: interrupted before the roles started — stopping what was started ({kept})"
    try:
        events = [r.get("event") for r in read_metrics(out)[since:]] if (out / METRICS_FILE).exists() else []
    except ValueError:  # a corrupt line: the phase is unknown, the generic stop is still true
        events = ["start"]
    if "finish" in events:
        return "omnirl: interrupted after the job had finished — stopping its roles (nothing left to checkpoint)"
    if "start" not in events:
        return ("omnirl: interrupted while the roles were loading — stopping them (nothing trained "
                + ("since --resume: the run's last checkpoint stands)" if resume else "yet: nothing to checkpoint)"))
    done = max(trained_steps(out), default=-1) + 1  # its highest step with a line, + 1
    return (f"omnirl: interrupted after {done} of {total} training steps — stopping every role (the actor "
            "checkpoints the steps it trained since its last checkpoint, if any; --resume continues)")


def left_behind(silent: str, job_name: str, forced: list[str], *, finished: bool) -> str:
    """One line naming what a stop could not clean up because the manifest's Redis does not answer
    (`silent`, `preflight.redis_silent`): the job's keys there, and the roles killed at the end of their
    short grace (`forced`), the actor's stop checkpoint with them."""
    keys = (f"job {job_name!r}'s keys there are not deleted" if finished else
            f"job {job_name!r} is not marked stopped there (its roles' last beats there count as a live run for "
            f"{LIVE_BEAT_S:.0f} s)")
    killed = ""
    if forced:
        killed = (f"; {', '.join(forced)} killed after {STATELESS_GRACE_S:.0f} s, waiting on it"
                  + (" (no stop checkpoint: --resume continues from the last complete one)"
                     if any(name.startswith("actor-") for name in forced) else ""))
    return f"omnirl: not cleaned up: {silent}, so {keys}{killed}"


def _finished_now(out: Path, since: int) -> bool:
    """Whether a controller this launcher started finished the job (a `finish` record after the first
    `since` of `out/metrics.jsonl`); False for a file that cannot be read (its run is kept, as `holds_run`)."""
    try:
        return finished(out, since)
    except (OSError, ValueError):
        return False


def holds_run(out: Path) -> bool:
    """Whether `out` holds a run to continue: its `metrics.jsonl` has a record (the controller's `start`
    line comes first, once the actor is ready; nothing is trained before it). A run stopped before that —
    a configuration error at start-up (exit 4), a Ctrl-C while the roles loaded — leaves the file empty,
    and was refused as "already holds a run: pass --resume" when run again after the fix. A file that
    cannot be parsed counts as a run (never started over)."""
    if not (out / METRICS_FILE).exists():
        return False
    try:
        return bool(read_metrics(out))
    except ValueError:  # a corrupt line: someone's run, which a fresh start must not overwrite
        return True


def invoked_as(argv0: str | None = None) -> str:
    """How the user's shell calls this `omnirl` again: `omnirl` when it was started by that name or that
    name on PATH is this program, else the path it was started by, quoted for a POSIX shell.

    `make demo` runs `.venv/bin/omnirl` with no venv activated: a `continue with: omnirl run …` line
    pasted from it failed with "omnirl: command not found". `argv0` defaults to `sys.argv[0]`; a
    `python -m omnirl.cli` run (argv0 `…/cli.py`) gets `omnirl`."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    if os.path.basename(argv0) != "omnirl" or os.sep not in argv0:
        return "omnirl"
    on_path = shutil.which("omnirl")
    if on_path and os.path.realpath(on_path) == os.path.realpath(argv0):
        return "omnirl"
    return shlex.quote(argv0)


def resume_command(args: argparse.Namespace, out: Path) -> str:
    """The `omnirl run` command that continues this run: the same job, `--out` and flags. Without
    `--steps` a resume trains to `spec.algorithm.steps` (e.g. 80 after a `--steps 3` run), and
    without `--device cpu` it places the roles on the GPUs. No `--resume` when nothing was started
    yet (`holds_run`: a stop while the roles loaded), where the same command starts the run afresh. Paths and
    values are quoted for a POSIX shell where they need it (`--out 'runs/my run'`): the line is pasted, so it
    starts with the program as the shell finds it (`invoked_as`: `.venv/bin/omnirl` when `omnirl` is not on PATH)."""
    flags = [f"--steps {args.steps}" if args.steps else "",
             f"--ray-address {shlex.quote(args.ray_address)}" if args.ray_address else "",
             "--no-ray" if args.no_ray else "",
             f"--device {args.device}" if getattr(args, "device", "auto") != "auto" else "",
             "--share-gpus" if getattr(args, "share_gpus", False) else "",
             "--resume" if holds_run(out) else ""]
    return " ".join([f"{invoked_as()} run", shlex.quote(args.job), "--out", shlex.quote(str(out)), *filter(None, flags)])


def verdict(code: int, failure: str, args: argparse.Namespace, out: Path, since: int | None = None) -> str:
    """The launcher's last line when it exits non-zero: why, and (after an interrupt, or a run
    directory that could not be written: `STORAGE_ERROR_EXIT`, whose `failure` ends with the fix)
    the command that continues the run, or that nothing is left when a controller this launcher
    started had finished before the Ctrl-C (a `--resume` would say "nothing to do").

    `since`: how many records `out/metrics.jsonl` held before this launcher started the roles (None:
    it started none). A finished earlier part of a resumed run is not this run finishing: a Ctrl-C
    while its roles were restarted said "after the job had finished: nothing to continue"."""
    if code == INTERRUPTED_EXIT:
        if since is not None and (out / METRICS_FILE).exists() and finished(out, since):
            return f"omnirl: interrupted (exit {code}) after the job had finished: nothing to continue"
        return f"omnirl: interrupted (exit {code}); continue with: {resume_command(args, out)}"
    if code == STORAGE_ERROR_EXIT:  # the failure ends with the fix ("free space there"): the resume follows it
        return f"omnirl: the job did not finish (exit {code}): {failure}, then continue with: {resume_command(args, out)}"
    return f"omnirl: the job did not finish (exit {code})" + (f": {failure}" if failure else "")


def _summary(out: Path, job_name: str, since: int) -> None:
    """The held-out table, then — when a controller this launcher started finished the job (a `finish`
    record after the first `since`) — its summary (`progress.finish_summary`)."""
    if not (out / METRICS_FILE).exists():
        return
    records = read_metrics(out)
    table = validation_table(records)
    if table:
        print(table, flush=True)
    summary = finish_summary(records, job_name, out / METRICS_FILE, since=since)
    if summary:
        print(summary, flush=True)
