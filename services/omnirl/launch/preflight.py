"""`omnirl run`'s pre-flight checks: refuse a run that cannot start, before anything starts.

The launcher (`launch/local.py::main`) calls these before it starts Redis, a judge server or a
role process. Each raises with the field or flag, the value and the fix: left to the roles, the
same fault would fail a role only after its start-up (and again after every `failurePolicy`
restart), or look like a hang. Only `lock_run_dir` leaves something behind: the run directory's lock.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import yaml

from omnirl.api.loader import dump_rljob
from omnirl.api.resume import resume_conflict, resume_notes
from omnirl.api.spec import MODEL_ROLES, RLJob
from omnirl.launch.placement import Placement
from omnirl.reward.registry import check_api_keys, check_in_process
from omnirl.transfer.owner import LIVE_BEAT_S


def missing_local_paths(job: RLJob) -> list[tuple[str, str, str]]:
    """The files `job` names that are not on this machine, as (field, path, what it must name): the prompt
    files (a directory is refused later, `controller.data`) and the model directory unless `builtin`. Paths as
    the job holds them (`loader.load_rljob` made relative ones absolute against the manifest's folder)."""
    spec = job.spec
    paths = [("spec.data.trainPrompts", spec.data.trainPrompts, "prompt file (one prompt per line)"),
             ("spec.data.validationPrompts", spec.data.validationPrompts, "prompt file (one prompt per line)")]
    if spec.model.path != "builtin":
        paths.append(("spec.model.path", spec.model.path, "model directory"))
    return [(field, path, kind) for field, path, kind in paths if path and not Path(path).exists()]


def check_local_paths(job: RLJob) -> None:
    """The files a local run reads, and the variables its VLM judges' `apiKeyEnv` name, checked
    before any process starts (a pod's paths are the operator's business: `omnirl validate` does not
    require them on this machine).

    Raises:
        FileNotFoundError: naming the field and the missing path.
        ValueError: an unset `spec.reward[i].params.apiKeyEnv` variable (`reward.registry.check_api_keys`), an
            in-process scorer its model cannot build (`reward.registry.check_in_process`: an OCR alphabet).
        ConfigError: `spec.telemetry.tensorboard` without the tensorboard package here.
    """
    for field, path, kind in missing_local_paths(job):
        raise FileNotFoundError(f"{field}: {path} does not exist on this machine; point it at a local "
                                f"{kind} (relative paths resolve against the manifest's folder)")
    check_model_weights(job)  # before the prompts: tokenizing them reads the model's config
    check_lora(job)
    check_clip(job)
    check_prompts(job)
    check_api_keys(job.spec.reward)  # the roles inherit this environment
    check_in_process(job.spec.reward)
    if job.spec.telemetry.tensorboard:  # the controller would stop with it after every role loaded
        from omnirl.telemetry.tensorboard import require_tensorboard

        require_tensorboard()


def check_model_weights(job: RLJob) -> None:
    """Every weights file the family's loader reads is in `spec.model.path` (the loader layer owns
    the list, `models.registry.check_weight_files`); left to the roles, a directory holding
    config.json alone would start every role and fail them seconds later.

    Raises:
        FileNotFoundError: naming `spec.model.path`, the missing file and the fix.
        ValueError: naming `spec.model.path` and an unreadable sharded-weights index.
    """
    from omnirl.models.registry import check_model_path

    check_model_path(job.spec.model.family, job.spec.model.path)


def check_lora(job: RLJob) -> None:
    """`spec.model.lora.targetModules` names layers of the model LoRA can adapt (`models.registry.check_lora_targets`,
    on a weightless skeleton); left to the roles, a typo (`qkv_proj` for `attn.qkv`) stopped the job, exit 4, after
    Redis, Ray and every role had started and loaded the model.

    Raises:
        ConfigError (a ValueError): naming `spec.model.lora.targetModules`, the target and the model's linear layers.
    """
    from omnirl.models.registry import check_lora_targets

    check_lora_targets(job.spec.model.family, job.spec.model.path, job.spec.model.lora)


def check_clip(job: RLJob) -> None:
    """A video family's `spec.model.video` (and `audio`) fits the VAE in `spec.model.path` (`models.registry.check_media`):
    left to the roles, every role loaded the model before the first one refused the frame count.

    Raises:
        ConfigError (a ValueError): naming `spec.model.video.<key>` and the nearest valid values.
    """
    from omnirl.api.errors import ConfigError
    from omnirl.models.registry import check_media

    try:
        check_media(job.spec)
    except ValueError as err:
        raise ConfigError(str(err)) from err


def check_attention(job: RLJob, placements: list[Placement]) -> None:
    """`spec.model.attention: cudnn` needs its rollout and actor processes on NVIDIA GPUs; the spec
    checks the manifest's accelerators, this checks where `omnirl run` put them (`--device cpu`).

    Raises:
        ValueError: naming the field, the process and its device, and the fix.
    """
    if job.spec.model.attention != "cudnn":
        return
    for p in placements:
        if p.role in MODEL_ROLES and p.kind != "nvidia":
            # not just "drop --device cpu": without GPUs, placement's own error sends the user back to it
            raise ValueError(f"spec.model.attention: cudnn runs on NVIDIA GPUs only, and {p.name} would run on "
                             f"{p.device}: set attention auto or torch for a CPU run, or run without --device "
                             f"{p.device} on a machine with NVIDIA GPUs")


def check_prompts(job: RLJob) -> None:
    """Tokenize the prompts the controller will (the training file, the validated head of the
    validation file) before any process starts: a prompt the model cannot take would otherwise fail
    the controller at start, be retried by every `restart-job`, and end the job after minutes.

    Raises:
        ValueError: naming the field, the file and line, the tokenizer's reason and the fix.
    """
    from omnirl.controller.data import check_prompts as check_prompt_file
    from omnirl.controller.data import numbered_prompts
    from omnirl.models.registry import load_tokenizer
    from omnirl.reward.registry import check_readable

    spec = job.spec
    tokenize = load_tokenizer(spec.model.family, spec.model.path)
    check_prompt_file(spec.data.trainPrompts, tokenize, "spec.data.trainPrompts")
    check_readable(spec.reward, numbered_prompts(spec.data.trainPrompts), f"spec.data.trainPrompts: {spec.data.trainPrompts}")
    if spec.data.validationPrompts:
        check_prompt_file(spec.data.validationPrompts, tokenize, "spec.data.validationPrompts",
                          spec.validation.maxPrompts)
        check_readable(spec.reward, numbered_prompts(spec.data.validationPrompts)[:spec.validation.maxPrompts],
                       f"spec.data.validationPrompts: {spec.data.validationPrompts}")


def lock_run_dir(out: Path) -> IO[str]:
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


def check_redis_server(job: RLJob) -> None:
    """`omnirl run` starts its own `redis-server` when the manifest names no Redis: it must be installed
    (a pip-installed omnirl brings no server; the traceback of `start_redis_server` came after job.yaml
    and the lock were written).

    Raises:
        ValueError: naming `redis-server`, how to install it and `spec.transferQueue.redisUrl`.
    """
    if job.spec.transferQueue.redisUrl or shutil.which("redis-server"):
        return
    raise ValueError("redis-server is not on PATH: omnirl run starts one for the job's TransferQueue when "
                     "spec.transferQueue.redisUrl is unset; install it (Debian/Ubuntu: apt-get install redis-server, "
                     "macOS: brew install redis), or set spec.transferQueue.redisUrl to a Redis you run")


def check_redis(url: str) -> None:
    """The manifest's own Redis must answer before any role starts: the roles' clients retry for
    minutes (to ride out a restart), so an unreachable URL would otherwise look like a silent hang.

    Raises:
        ValueError: naming `spec.transferQueue.redisUrl`, the host and port (never the password) and the fix.
    """
    from omnirl.transfer.client import RedisError, check_answers

    parts = urlsplit(url)
    try:
        check_answers(url, timeout_s=5)
    except (RedisError, OSError, ValueError) as err:
        raise ValueError(f"spec.transferQueue.redisUrl: {parts.hostname}:{parts.port or 6379} does not answer "
                         f"({type(err).__name__}: {err}); start that Redis or fix the URL, or remove redisUrl so "
                         "omnirl run starts its own redis-server") from err


def _refusal(client, url: str, job: RLJob, out: Path | None, owner: dict | None, own: Path | None) -> str | None:
    """Why `job` may not start on the manifest's Redis given its run-owner record `owner` (None: none), or
    None (`check_not_running_elsewhere` says what is refused and why; `claim_run` decides with it). `own`: this
    run's --out: a leased record of this host and that --out is a killed predecessor's (this launcher holds the
    run directory's lock), not a live run."""
    import socket
    import time

    from omnirl.transfer.keys import job_pattern
    from omnirl.transfer.owner import LOCAL, NO_RECORD, OWNER_TTL_S, RLJOB, beats_text, describe, leased, live_beats
    from omnirl.transfer.records import JobRecords

    name = job.metadata.name
    parts = urlsplit(url)
    where = f"{parts.hostname}:{parts.port or 6379} (spec.transferQueue.redisUrl)"
    if owner is not None and owner["kind"] == RLJOB:  # renewed by its operator while it runs: live, pods or not
        if owner.get("suspended"):
            return (f"metadata.name: job {name!r} on {where} is claimed by {describe(owner)}, which is suspended "
                    "(spec.suspend) with its pending work in this Redis, and starting here would delete it: give "
                    "this run another metadata.name, or resume that RLJob (spec.suspend: false) or delete it")
        return (f"metadata.name: job {name!r} on {where} is claimed by {describe(owner)}, which its operator runs, "
                "and starting here would delete or take over its work: give this run another metadata.name, or let "
                f"that RLJob finish or delete it (the claim is released then; it lapses "
                f"{owner.get('lease_s', OWNER_TTL_S):g} s after its last reconcile if its operator is gone)")
    mine = own is not None and (owner or {}).get("kind") == LOCAL and \
        (owner.get("host"), owner.get("out")) == (socket.gethostname(), str(own))
    if owner is not None and leased(owner) and not mine:  # another launcher renews it: live from its claim, before any beat
        beats = live_beats(client, name)
        seen = f"last heartbeats: {beats_text(beats)}" if beats else "starting: no role beats yet"
        return (f"metadata.name: job {name!r} is running on {where[:-1]}; {seen}); {describe(owner)} holds it on "
                "this Redis, and starting here would delete or take over its work: stop it, or give this run another "
                f"metadata.name (a launcher killed with SIGKILL: its claim lapses after {owner['lease_s']:g} s)")
    records = JobRecords(client, name)
    was = records.stopped_run()
    if records.stop_requested():
        here = out if out is not None else own  # a fresh run's --out, or the --out a --resume continues
        if here is None or was is None:
            return None
        if (was.get("host"), was.get("out")) == (socket.gethostname(), str(here)):
            return None  # its own --resume, or its own --out again (the directory was removed): a fresh start
        # another --out's pending work: a fresh start deletes it; a --resume of another run of this name takes it
        # over (its actor met that run's progress and exited 4, "the checkpoint directory was lost or belongs to
        # another run", and the stopped run's record and place then named the --resume's --out)
        does = "a fresh start here would delete" if out is not None else \
            f"a --resume of {here} would take over (its actor cannot continue another run's steps)"
        ago = max(time.time() - float(was.get("time", 0)), 0) / 60
        host, port, db = parts.hostname, parts.port or 6379, (parts.path or "/0").strip("/") or "0"
        return (f"metadata.name: job {name!r} on {host}:{port} (spec.transferQueue.redisUrl) holds the pending work "
                f"of a run that was stopped before it finished ({was.get('host')}:{was.get('out')}, {ago:.0f} min "
                f"ago), which {does}: continue it with omnirl run JOB --out "
                f"{was.get('out')} --resume, or give this run another metadata.name (to drop that work: redis-cli "
                f"-h {host} -p {port} -n {db} --scan --pattern '{job_pattern(name)}' | xargs -r redis-cli -h {host} "
                f"-p {port} -n {db} unlink)")
    beats = live_beats(client, name)
    if beats and mine:  # this --out's launcher (this one holds its lock now) was killed: its roles' last beats
        wait = max(LIVE_BEAT_S - beats[0][0], 1.0)  # (it said "stop it", naming a pid that was gone)
        return (f"metadata.name: job {name!r} on {where}: the last launcher of this --out (pid {owner.get('pid')}) "
                f"was killed without stopping its roles, whose last heartbeats ({beats_text(beats)}) count as a "
                f"live run for {LIVE_BEAT_S:.0f} s: run this again in {wait:.0f} s")
    if beats:  # no record, or an older launcher's (no lease): its roles' beats say it runs
        who = describe(owner) if owner is not None else NO_RECORD
        return (f"metadata.name: job {name!r} is running on {where[:-1]}; last heartbeats: {beats_text(beats)}); "
                f"{who} uses this Redis, and starting here would delete or take over its work: stop it, or give this "
                f"run another metadata.name (a run just killed: its beats stop counting after {LIVE_BEAT_S:.0f} s)")
    return None


def check_not_running_elsewhere(url: str, job: RLJob, out: Path | None = None, own: Path | None = None) -> None:
    """A job whose name is live on the manifest's Redis — another `omnirl run` of it, in another --out
    or on another machine, or an RLJob of that name on a shared Redis — is not started again there: a
    fresh run deletes the job's keys first (`TransferQueue.cleanup`), so the other run's roles failed on
    "UNBLOCKED the stream key no longer exists" and restarted, and this run's actor found that run's
    progress (`actor_state`) and refused to start (exit 4, "the checkpoint directory was lost or belongs
    to another run"). Live: a run-owner record that its holder renews (`transfer/owner.py`: an RLJob's
    operator, running or suspended, or another launcher, from its claim on, before its roles beat), or a
    heartbeat younger than `LIVE_BEAT_S` and no `stop` flag (a run that left no record: an older omnirl).
    The record names the live run. This check reads only, to fail early; `claim_run` decides again, atomically.

    `own`: this run's --out (its killed predecessor's claim is no other run). `out`: the --out of a fresh
    run (None: a `--resume`, which keeps the job's keys). A fresh run from
    another --out than a stopped, unfinished run's (`mark_stopped`) is refused too: its start deletes
    the job's keys, the stopped run's pending work, and that run's `--resume` then failed at start-up
    (exit 4, "the checkpoint directory was lost or belongs to another run"); so is a `--resume` of another
    --out (`own`), whose actor cannot continue that run's steps (exit 4 once its roles loaded, and the
    stopped run's place then named the --resume's --out).

    Raises:
        ValueError: naming `metadata.name`, the Redis (never its password), the live workers or the
            stopped run's place, and the fix.
    """
    from omnirl.transfer.client import probe_client
    from omnirl.transfer.owner import read_owner

    with probe_client(url) as client:
        why = _refusal(client, url, job, out, read_owner(client, job.metadata.name), own)
    if why is not None:
        raise ValueError(why)


def redis_silent(url: str, timeout_s: float = 2.0) -> str:
    """Why the manifest's Redis does not answer a PING within `timeout_s` (no retries), or "" when it does.

    Asked when the launcher stops a run on an external Redis: the roles' clients retry a Redis that went
    away for about 2 minutes, so a role waiting on it cannot act on SIGTERM (the actor never reached its
    stop checkpoint and was killed after its `terminationGracePeriodSeconds`, 60 s), and the launcher's
    own cleanup there cannot be done.

    Returns:
        "" when it answers, else "HOST:PORT (spec.transferQueue.redisUrl) does not answer (ERROR)"
        (never the password).
    """
    from omnirl.transfer.client import RedisError, check_answers

    try:
        check_answers(url, timeout_s)
    except (RedisError, OSError) as err:
        parts = urlsplit(url)
        return (f"{parts.hostname}:{parts.port or 6379} (spec.transferQueue.redisUrl) does not answer "
                f"({type(err).__name__}: {err})")
    return ""


class RunClaim:
    """This launcher's claim of its job's name on a shared Redis (`claim_run`): a thread renews the record's
    lease every `LOCAL_RENEW_S` until `close`, and says once on stdout when it cannot. A record that is gone
    (a Redis restarted without persistence, a lease lapsed while Redis did not answer, a hand deletion) is
    claimed again, atomically, when no other run took the name meanwhile: before, the run went on without
    one, and a second run or an RLJob of its name was told that it was "a run that left no run-owner record
    (an omnirl older than that record, or a launcher killed …)"."""

    def __init__(self, url: str, job: RLJob, out: Path, lease_s: float) -> None:
        import threading

        self.url, self.name, self.out, self.lease_s = url, job.metadata.name, str(out), lease_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="omnirl-run-owner", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        from omnirl.transfer.client import RedisError, probe_client
        from omnirl.transfer.owner import LOCAL_RENEW_S, claim, describe, local_owner, renew_local

        said = False
        parts = urlsplit(self.url)
        where = f"job {self.name!r} on {parts.hostname}:{parts.port or 6379}"
        while not self._stop.wait(min(LOCAL_RENEW_S, self.lease_s / 3)):
            try:
                with probe_client(self.url) as client:
                    if renew_local(client, self.name, self.out, self.lease_s):
                        said = False
                        continue
                    # gone, or another run's: claimed again only when gone (atomic, as the first claim)
                    other = claim(client, self.name, local_owner(self.out, self.lease_s),
                                  lambda owner: None if owner is None else describe(owner), self.lease_s)
                    if other is None:
                        print(f"omnirl: this run's claim of {where} was gone (a Redis restarted without "
                              "persistence, a lease lapsed while Redis did not answer, or the key deleted); "
                              "claimed it again", flush=True)
                        said = False
                        continue
                    says = (f"omnirl: this run's claim of {where} was taken by {other} (its lease lapsed while "
                            "this launcher did not renew it): the two runs share the job's keys; stop one of them")
            except (RedisError, OSError, ValueError) as err:
                says = (f"omnirl: could not renew this run's claim of {where} ({type(err).__name__}: {err}); it "
                        f"lapses {self.lease_s:.0f} s after the last renewal, and another run of that name could "
                        "then start there")
            if not said:  # once per failure streak: the run goes on, but its name may be taken
                print(says, flush=True)
                said = True

    def close(self) -> None:
        """Stop renewing (the record stays until `mark_stopped` or its lease lapses)."""
        self._stop.set()
        self._thread.join()


def claim_run(url: str, job: RLJob, out: Path, resume: bool = False, lease_s: float | None = None) -> RunClaim:
    """Claim the job's name on the manifest's Redis for this run (`transfer/owner.py`: this host, `out`,
    this pid), atomically, before the run touches the job's keys (a fresh run's cleanup, a `--resume`'s
    flags): of two launchers, or a launcher and an operator, claiming in one instant, exactly one wins. The
    operator then refuses an RLJob of this name on that Redis while this run lives, naming this run. The
    record lives `lease_s` seconds (default `LOCAL_LEASE_S`) and the returned claim's thread renews it.

    Raises:
        ValueError: the name is live there (`check_not_running_elsewhere`'s sentence: the other run and the fix).
        redis.RedisError: the Redis that answered the pre-flight check went away.
    """
    from omnirl.transfer.client import probe_client
    from omnirl.transfer.owner import LOCAL_LEASE_S, claim, local_owner

    lease_s = LOCAL_LEASE_S if lease_s is None else lease_s
    with probe_client(url) as client:
        why = claim(client, job.metadata.name, local_owner(str(out), lease_s),
                    lambda owner: _refusal(client, url, job, None if resume else out, owner, out), lease_s)
    if why is not None:
        raise ValueError(why)
    return RunClaim(url, job, out, lease_s)


def mark_stopped(url: str, job: RLJob, out: Path, finished: bool) -> str:
    """Set `job`'s `stop` flag on the manifest's Redis once this launcher has stopped every role it
    started: its roles' last beats stay younger than `LIVE_BEAT_S` for a while, and without the flag
    the `--resume` the launcher prints after a Ctrl-C was refused by `check_not_running_elsewhere` as
    "running on REDIS … another omnirl run or RLJob of that name" — the run's own stopped roles. A run
    that did not finish also leaves its place (`STOPPED_RUN`: this host and `out`), so that a fresh run
    of the job from another --out is refused instead of deleting the work its `--resume` needs, and its
    run-owner record stays, marked stopped and without a TTL (`owner.stop_local`): the pending
    work stays this run's. A `--resume` (`supervise.clear_start_flags`) and a fresh run
    (`TransferQueue.cleanup`) clear both.

    A run that finished (or whose controller never started) deletes the job's keys instead, its record
    with them: they hold no pending work (the checkpoints and metrics are in `out`; a `--resume` for more
    steps starts from the checkpoint), and an RLJob of that name on this Redis, whose pods cannot tell a
    predecessor's keys from their own, met them: its actor exited 4 at once ("the job's actor had trained
    step 1, but there is none … the checkpoint directory was lost or belongs to another run"), and with
    the `stop` flag alone every role would have ended at once.

    Only while the job's run-owner record is this run's (or gone), atomically (`owner.stop_local`): a record
    naming another run (an RLJob or a launcher that took the name after this run's lease lapsed) leaves every
    key as it is. Before, the `stop` flag ended that run's roles, this run's place sent its users to this
    run's --resume, and a run stopped while loading deleted that run's record and pending work.

    A client of its own with 5 s timeouts and no retries: the job's queue retries for minutes, and a
    Redis that went away must not hold the launcher's exit.

    Returns:
        "" once done, else why not, for the launcher to print: the error (never the password), or the other
        run that holds the name and what this run left undone.
    """
    import socket
    import time

    from omnirl.transfer.client import RedisError, probe_client
    from omnirl.transfer.owner import describe, stop_local

    name = job.metadata.name
    parts = urlsplit(url)
    where = f"{parts.hostname}:{parts.port or 6379}"
    try:
        with probe_client(url) as client:
            place = {"host": socket.gethostname(), "out": str(out), "time": time.time()}
            other, _ = stop_local(client, name, str(out), finished, place)
    except (RedisError, OSError, ValueError) as err:
        return (f"could not mark job {job.metadata.name!r} stopped on {where} "
                f"({type(err).__name__}: {err}); a --resume within {LIVE_BEAT_S:.0f} s is refused as running")
    if other is not None:
        did = "deleted no keys there" if finished else "set no stop flag and left no place there"
        return (f"job {name!r} on {where} is held by {describe(other)}, not this run (its claim was taken while this "
                f"launcher did not renew it): this run {did}, as its keys are that run's now (the two runs may have shared "
                "them meanwhile)")
    return ""


def clear_finished(url: str, job: RLJob, out: Path) -> str:
    """What `omnirl run --resume` of a finished run (nothing to do) does with the job's keys on the manifest's
    Redis: what that run does once it finishes (`mark_stopped`, finished): it deletes them, as they hold no
    pending work (the checkpoints and metrics are in `out`), when the name is this run's to take, as its
    `--resume` would (`claim_run`: atomically; the record gone, or this --out's, stopped or of a killed
    launcher whose roles no longer beat). Left there by a launcher killed after the job's `finish` record, or
    an older one that kept them after a Ctrl-C, they made a fresh run of that name from another --out refused
    ("holds the pending work of a run that was stopped before it finished …: continue it with … --resume"),
    and that --resume said "nothing to do" and left them. Keys another run holds are left.

    Returns:
        The line for the launcher to print: the keys deleted, or why they were left (another run holds the name,
        the Redis does not answer: never the password); "" when there were none.
    """
    import socket
    import time

    from omnirl.transfer.client import RedisError, probe_client
    from omnirl.transfer.owner import LOCAL_LEASE_S, claim, describe, local_owner, stop_local

    name, parts = job.metadata.name, urlsplit(url)
    redis_at = f"{parts.hostname}:{parts.port or 6379} (spec.transferQueue.redisUrl)"
    where = f"job {name!r} on {redis_at}"
    had: list[bool] = []  # whether a record was there before this claim (it is among the keys deleted)
    try:
        with probe_client(url) as client:

            def refusal(owner: dict | None) -> str | None:
                had[:] = [owner is not None]
                return _refusal(client, url, job, None, owner, out)

            why = claim(client, name, local_owner(str(out), LOCAL_LEASE_S), refusal, LOCAL_LEASE_S)
            if why is not None:
                return f"left the keys of {where} as they are: {why}"
            place = {"host": socket.gethostname(), "out": str(out), "time": time.time()}
            other, removed = stop_local(client, name, str(out), True, place)
    except (RedisError, OSError, ValueError) as err:
        return (f"could not delete the keys {where} may have left ({type(err).__name__}: {err}); a fresh run of "
                "that name elsewhere may be refused until they are gone")
    if other is not None:  # cannot happen: this run's claim held the record since; said rather than hidden
        return f"left the keys of {where} as they are: {describe(other)} holds the name"
    left = removed - (0 if had and had[0] else 1)  # this claim's own record is not a leftover
    if left <= 0:
        return ""
    return (f"deleted the {left} key{'s' if left != 1 else ''} job {name!r} had left on {redis_at}, as the run does once it "
            f"finished: they held no pending work (its checkpoints and metrics are in {out}); the name is free there")


def _get(doc: object, keys: tuple[str, ...]) -> object:
    """`doc[k0][k1]…`, None where a level is missing or not a mapping."""
    for key in keys:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def check_same_job(job: RLJob, out: Path, flag: str = "--resume") -> str | None:
    """`--resume` continues the run in `out` only with that run's job: its name (the Redis key prefix
    of its pending work) and algorithm, as recorded in `out/job.yaml`, and (with `flag` `--resume`) the
    fields its pending steps, checkpoints and scores were made with (`api/resume.py::resume_changes`:
    `groupSize`, `promptsPerStep`, `seed`, …, the model and its LoRA layout, the rewards' definitions;
    before, a larger `groupSize` hung the resumed run at its first step, a LoRA rank 4 → 8 restarted the
    job until `maxRestarts`). `flag` starts the message: `--out` when the run was not resumed (then
    "pass --resume" would mislead).

    Returns:
        With `--resume`, one line for the accepted reward changes (`api/resume.py::resume_notes`: new
        weights combine the pending scores too), else None.
    Raises:
        ValueError: naming the field, both values and the fix.
    """
    path = out / "job.yaml"
    if not path.exists():
        return None
    before = yaml.safe_load(path.read_text()) or {}
    fields = (("metadata.name", job.metadata.name, ("metadata", "name")),
              ("spec.algorithm.name", job.spec.algorithm.name, ("spec", "algorithm", "name")))
    for field, now, keys in fields:
        was = _get(before, keys)
        if was is not None and was != now:
            raise ValueError(f"{flag}: {out} holds a run with {field} {was!r}, not {now!r}; resume it with its own "
                             "manifest, or start a new run (another --out) with model.path: OUT/exports/latest")
    if flag == "--resume":
        conflict = resume_conflict(before, dump_rljob(job), where=f"{flag}: {out} holds a run",
                                   fix="put the earlier values back to resume it, or start a new run (another --out) with "
                                       "model.path: OUT/exports/latest to continue from its weights")
        if conflict:
            raise ValueError(conflict)
        return resume_notes(before, dump_rljob(job))
    return None
