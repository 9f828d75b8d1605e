"""`omnirl role ROLE --job FILE`: the entrypoint of every container and every local role process.

It reads the job manifest and the OMNIRL_* environment (`omnirl.api.runtime.RoleEnv`), serves the
gRPC health service and `/metrics` when their ports are set, runs the role's service, and exits
0 when the job finished or non-zero with the reason as its last stderr line. A role that starts once
the job has finished (its `finish` record in Redis, `finished_record`) exits 0 at once, before torch
is imported, with one line saying so: a pod restarted in place or rolled after the job's end.

`OMNIRL_RESUME` (`RoleEnv.resume`): `1` resume from the latest checkpoint (without one the actor
exits `CONFIG_ERROR_EXIT` before its model loads, one line naming the path and the fix),
`auto` resume when a complete checkpoint exists and start fresh otherwise (what pods and the local
supervisor's restarts use), `0` or unset start fresh. SIGTERM asks the service to finish or hand back its work (the actor
writes a checkpoint) and exits `TERMINATED_EXIT`; the health service reports NOT_SERVING once the role's main
loop has not beaten for `failurePolicy.progressDeadlineSeconds`.

Exit codes: `omnirl.api.exits` owns them and what each means (docs/reference/exit-codes.md, `omnirl role`); a
`ConfigError` at start-up, a controller's `JobFailed` and a run directory that cannot be written
(`omnirl.system.disk`) exit with a permanent code, printed as one line and never restarted.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from omnirl.api.errors import ConfigError
from omnirl.api.exits import (
    CONFIG_ERROR_EXIT,
    DONE,
    FAILED,
    INTERRUPTED_EXIT,
    JOB_FAILED_EXIT,
    STORAGE_ERROR_EXIT,
    TERMINATED_EXIT,
)
from omnirl.api.loader import load_rljob
from omnirl.api.runtime import VARIABLES, RoleEnv
from omnirl.launch.placement import n_threads
from omnirl.system.causes import cause_of
from omnirl.system.disk import failure, storage_error
from omnirl.transfer.client import RECONNECT_S


def resolve_device(device: str, environ: dict[str, str] | None = None) -> str:
    """The indexed torch device of a role process: ``"cuda"`` → ``"cuda:N"``.

    N is ``LOCAL_RANK`` when set (torchrun and several ranks sharing one host's devices), else 0:
    the process's first visible device — in a pod the device plugin exposes only the pod's own
    devices, and `omnirl run` sets ``CUDA_VISIBLE_DEVICES`` per process. ``"cpu"`` and indexed
    devices are returned unchanged. NCCL/HCCL need the index (``torch.cuda.set_device("cuda")``
    raises "Expected a torch.device with a specified index").

    Raises:
        ValueError: an unknown device type (names the variable and the allowed values).
    """
    env = os.environ if environ is None else environ
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda", "npu"):
        raise ValueError(f"OMNIRL_DEVICE={device!r}: expected cpu, cuda[:N] or npu[:N]")
    if kind == "cpu" or index:
        return device
    local = env.get("LOCAL_RANK", "0")
    if not local.isdigit():
        raise ValueError(f"LOCAL_RANK={local!r} must be a non-negative integer")
    return f"{kind}:{int(local)}"


def _setup(env: RoleEnv, role: str) -> RoleEnv:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {role} %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    import torch

    env = dataclasses.replace(env, device=resolve_device(env.device))
    kind, _, index = env.device.partition(":")
    if kind == "npu":
        import torch_npu  # noqa: F401 - registers the npu device (Ascend images ship it)

        torch.npu.set_device(env.device)
    elif kind == "cuda":
        if int(index) >= torch.cuda.device_count():
            raise ValueError(f"OMNIRL_DEVICE={env.device}: this process sees {torch.cuda.device_count()} CUDA "
                             f"device(s) (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
        torch.cuda.set_device(env.device)  # NCCL, compile and default allocations use it
    if env.threads:
        torch.set_num_threads(env.threads)
    logging.getLogger("omnirl").info("%s on %s, %s", role, env.device, n_threads(torch.get_num_threads()))
    return env


def should_resume(mode: str, checkpoint_root: Path) -> bool:
    """Whether this role process resumes: `1` always (the actor then exits `CONFIG_ERROR_EXIT`
    without a checkpoint, `omnirl.actor.service.nothing_to_resume`), `auto` when
    `checkpoint_root/latest` is complete, `0` never."""
    from omnirl.models.policy_io import has_checkpoint

    return mode == "1" or (mode == "auto" and has_checkpoint(checkpoint_root))


def run_role(role: str, job_path: str, env: RoleEnv) -> int:
    """Run one role to completion in this process with `env` (its `resume` and `steps` included);
    returns the exit code (`TERMINATED_EXIT` after SIGTERM)."""
    job = load_rljob(job_path)
    done = finished_record(job, env, role)
    if done is not None:
        print(finished_line(role, done), file=sys.stderr, flush=True)
        return DONE
    started = _beat_while_starting(job, env, role)
    try:
        env = _setup(env, role)
        resume = should_resume(env.resume, Path(env.out_dir) / job.spec.checkpoint.dir)
        steps = env.steps
        health = None
        if env.health_port:
            from omnirl.telemetry.health import HealthServer

            health = HealthServer(env.health_port)
        service = _build(role, job, env, resume=resume, steps=steps)
    finally:
        started()
    old = signal.signal(signal.SIGTERM, lambda signum, frame: service.terminate())
    if health:
        deadline = job.spec.failurePolicy.progressDeadlineSeconds
        health.set_liveness(lambda: service.heartbeat.age_s() <= deadline)
        health.set_serving(True)
    try:
        service.run()
        if service.terminated:
            print(f"omnirl role {role}: stopped by SIGTERM, work handed back", file=sys.stderr, flush=True)
            return TERMINATED_EXIT
        if role == "controller":  # its summary is the `finish` line of metrics.jsonl, logged readably
            service.stop()
        return DONE
    finally:
        signal.signal(signal.SIGTERM, old)
        if health:
            health.stop()
        service.close()


def finished_record(job, env: RoleEnv, role: str) -> dict | None:
    """The job's `finish` record when its controller has finished the job's steps (`OMNIRL_STEPS`, else
    `spec.algorithm.steps`), else None: then this role process has nothing to do. A pod restarted in place
    after the last step (the actor SIGKILLed right after its last result, a rollout pod after the `finish`
    record) or a whole-job restart after the controller died past its `finish` line (its Job failed, the
    operator's `restart-job`) ran the finished job again: the new controller exported the last checkpoint
    once more (`exports/step-000002.1`) and wrote a second `start` and `finish`.

    Read from the job's Redis (`kv:finished`, `transfer/records.py::FINISHED`, which the controller writes right
    after the line). The controller also reads its run directory's `metrics.jsonl` (it died between the line
    and the key) and then writes the key and sets the `stop` flag, which its predecessor may not have set: the
    roles still running end as they do after any finish.

    Returns:
        The record (`event`, `time` in s since the epoch, `total_steps`, ...), or None.

    Raises:
        redis.RedisError: the job's Redis did not answer within the client's retries (about 2 minutes).
        json.JSONDecodeError: `kv:finished`, or a line of `metrics.jsonl` (controller), that is not JSON.
    """
    from omnirl.api.run_dir import METRICS_FILE, finish_covers, read_metrics
    from omnirl.transfer.client import redis_client
    from omnirl.transfer.records import JobRecords

    total = env.steps if env.steps is not None else job.spec.algorithm.steps
    client = redis_client(env.redis_url)
    records = JobRecords(client, env.job_name)
    try:
        record = records.finish_record()
        if record is None and role == "controller" and (Path(env.out_dir) / METRICS_FILE).is_file():
            ends = [r for r in read_metrics(Path(env.out_dir)) if r.get("event") in ("start", "finish")]
            record = ends[-1] if ends and ends[-1]["event"] == "finish" else None
        if not finish_covers(record, total):
            return None  # a run resumed for more steps than it finished: not done
        if role == "controller":
            records.set_finish_record(record)
            records.request_stop()
        return record
    finally:
        client.close()


def finished_line(role: str, record: dict) -> str:
    """The one line of a role process that found the job finished (`finished_record`)."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(record.get("time") or 0)))
    return (f"omnirl role {role}: the job had finished ({record.get('total_steps')} training steps; its controller "
            f"wrote the finish record at {when}): nothing to do, exiting 0")


def _beat_while_starting(job, env: RoleEnv, role: str) -> Callable[[], None]:
    """Beat for this process while it starts, for at most `failurePolicy.startupDeadlineSeconds`;
    returns the function that stops (the service's own heartbeat takes over).

    Start-up is importing torch (seconds; more with every role starting on a few cores), setting
    up the device and building the service: the model, checkpoint and scorer loads, the actor
    ranks' rendezvous (minutes from slow storage). None of it is a hang, and a beat before it (the
    launcher counts a process from its spawn) keeps `progressDeadlineSeconds` about the main loop.
    A start-up still running past the bound is stale `progressDeadlineSeconds` later.
    """
    from omnirl.transfer.client import plain_client
    from omnirl.transfer.heartbeat import Heartbeat

    client = plain_client(env.redis_url)  # Redis away: the thread warns, the service's queue waits for it
    policy = job.spec.failurePolicy
    beat = Heartbeat(client, env.job_name, role, env.worker_id, ttl_s=2 * policy.progressDeadlineSeconds)
    stop = beat.start_covering(policy.startupDeadlineSeconds, startup=True)

    def started() -> None:
        stop()
        client.close()

    return started


def _build(role: str, job, env: RoleEnv, *, resume: bool, steps: int | None):
    if role == "rollout":
        if env.rank > 0:  # a rank of a replica of several (docs/parallel.md): it follows its leader, rank 0
            from omnirl.rollout.follower import RolloutFollower

            return RolloutFollower(job, env)
        from omnirl.rollout.service import RolloutService

        return RolloutService(job, env)
    if role == "reward":
        from omnirl.reward.service import RewardService

        return RewardService(job, env)
    if role == "actor":
        from omnirl.actor.service import ActorService

        return ActorService(job, env, resume=resume)
    if role == "controller":
        from omnirl.controller.loop import Controller

        return Controller(job, env, resume=resume, steps=steps)
    raise ValueError(f"unknown role {role!r}; expected rollout, reward, actor or controller")


# a BindingError with `mismatch` (names or shapes that do not fit) comes back on every restart
BINDING_FIX = ("the actor's model and the rollout's differ (each restart loads the same two again): both roles must "
               "load the same spec.model (family, path, lora) with the same omnirl version (the same image in "
               "roles.actor.template and roles.rollout.template)")


def _binding_mismatch(err: BaseException) -> bool:
    """`err` is a weight-sync `BindingError` whose names or shapes did not fit (not a checksum alone).
    Imported here: the weight_sync package imports torch, which `omnirl role` loads only with a role."""
    from omnirl.weight_sync.errors import BindingError

    return isinstance(err, BindingError) and err.mismatch


def main(args: argparse.Namespace) -> int:
    """CLI adapter for `omnirl role`: the environment is read only through `RoleEnv`."""
    try:
        env = RoleEnv.from_environ()
        if args.out:
            env = dataclasses.replace(env, out_dir=args.out)
        if env.ranks_per_pod > 1 or env.replica_hosts:  # a pod holding ranks of a model role (docs/parallel.md)
            from omnirl.launch.pod_ranks import pod_rank_envs, run_pod_ranks

            envs = pod_rank_envs(args.role, load_rljob(args.job).spec, env)
            if envs is not None and len(envs) > 1:
                return run_pod_ranks(args.role, args.job, envs)
            env = envs[0] if envs else env
        return run_role(args.role, args.job, env)
    except KeyboardInterrupt:
        return INTERRUPTED_EXIT
    except ConfigError as err:  # the same on every restart: one line, no traceback, a permanent exit code
        print(f"omnirl role {args.role}: configuration error: {err}", file=sys.stderr, flush=True)
        return CONFIG_ERROR_EXIT
    except Exception as err:
        if args.role == "controller" and type(err).__name__ == "JobFailed":  # a verdict, not a crash
            print(f"omnirl role controller: the job failed: {err}", file=sys.stderr, flush=True)
            return JOB_FAILED_EXIT
        if args.role == "controller" and type(err).__name__ == "RoleFailed":
            # another role's failure, relayed: that role prints its own line (and its traceback, for a
            # crash) and exits with its own code, which decides; the controller's stack only showed where
            # it read the report, a traceback before a configuration error's one clear line
            print(f"omnirl role controller: {err}", file=sys.stderr, flush=True)
            return FAILED
        if _binding_mismatch(err):
            print(f"omnirl role {args.role}: configuration error: {err}; {BINDING_FIX}", file=sys.stderr, flush=True)
            return CONFIG_ERROR_EXIT
        full = storage_error(err)
        if full is not None:  # a restart would fail the same way: one line, a permanent exit code
            what, fixed = failure(full, os.environ.get(VARIABLES["out_dir"]))
            raised = "" if full is err else f" ({type(err).__name__}: {err})"  # a library's own wrapper
            print(f"omnirl role {args.role}: {what}{raised}; {fixed}", file=sys.stderr, flush=True)
            return STORAGE_ERROR_EXIT
        lost = _redis_lost(err)
        if lost is not None:  # not a bug of the role: a traceback of redis-py's retry loop told the user nothing
            url = urlsplit(os.environ.get(VARIABLES["redis_url"], ""))  # host:port/db as the launcher's lines, no password
            where = f"{url.hostname}:{url.port or 6379}{url.path if url.path not in ('', '/') else ''}"
            print(f"omnirl role {args.role}: Redis at {where} did not answer through its calls' retries (about "
                  f"{RECONNECT_S:.0f} s; {type(lost).__name__}: {lost}); this role gives up (exit 1) and the "
                  "supervisor (omnirl run, or the operator) decides whether the job goes on", file=sys.stderr,
                  flush=True)
            return FAILED
        logging.getLogger("omnirl").exception("role %s failed", args.role)
        print(f"omnirl role {args.role} failed: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        return FAILED


def _redis_lost(err: BaseException) -> BaseException | None:
    """The redis-py `ConnectionError` or `TimeoutError` (its retries spent) that `err` is or was raised from,
    else None."""
    from omnirl.transfer.client import REDIS_AWAY

    return cause_of(err, REDIS_AWAY)
