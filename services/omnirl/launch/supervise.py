"""The local launcher's supervisor: it heals roles the way Kubernetes would, per `failurePolicy`.

A role replica fails when its process exits before the job finished (a crash, SIGKILL, SIGTERM)
or when its heartbeat in Redis is older than `progressDeadlineSeconds` (a hung or SIGSTOPped
process: it is SIGKILLed first). Then, per `spec.failurePolicy.{role}`:

- `restart-role` (rollout, reward by default): that replica is started again with the same worker
  id; it takes back its own pending entries, rejoins the weight broadcast and gets the current
  version (`WeightSender.serve_new_members`). Like a Deployment.
- `restart-job` (actor, controller by default): every role is stopped (SIGTERM, the actor writes a
  checkpoint, SIGKILL after `terminationGracePeriodSeconds`) and started again with
  `OMNIRL_RESUME=auto`: the actor continues from the latest checkpoint and replays the handed-over
  batches after it, the controller from the actor's state, reusing the scored groups in Redis.
- `fail-job`: the job stops with the role's exit code.

A controller that exits with `JOB_FAILED_EXIT` (the job itself failed: a required scorer is down,
every group of a step failed), and any role that exits with `CONFIG_ERROR_EXIT` (a setting it
cannot run with: a model directory without the family's layout, an unreadable checkpoint), stop the
job at once with the role's one-line message: restarting cannot help (`omnirl.api.runtime`). When
roles die together the most specific cause decides: a role's permanent exit before the controller's
exit 1, which often repeats a failure the role reported (`RoleFailure`) before exiting itself.
So does a run directory that cannot be written (`omnirl.system.disk`): a role that exits
`STORAGE_ERROR_EXIT`, or any role or the embedded Redis dying while a probe write to `out` fails
(a Redis that cannot append to its AOF exits 1 and is not restarted then). The job stops with
`STORAGE_ERROR_EXIT`, no restart spent; `--resume` continues once there is room.

Each replica's restarts and the job's restarts count against `maxRestarts` separately; one more
fails the job (`omnirl.api.failure_policy`, the decision the operator makes too). The embedded Redis (AOF) is restarted on its port and directory when it dies. A manifest's
Redis (`spec.transferQueue.redisUrl`) is the user's: it is PINGed every `REDIS_PROBE_S`, and while it does
not answer a line says since when and what happens next (every `REDIS_NOTE_S`), no role is judged by its
heartbeat or exit, and after `REDIS_DOWN_S` the job stops (exit 1, `--resume` once it is back); before, the
supervisor sat silent in a heartbeat read's retries (2 minutes per call) and then died on a traceback.
Every action is printed (`omnirl: …`) and appended to `OUT/events.jsonl`; `OUT/roles.json` names
the current process ids (the chaos suite reads it).
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from omnirl.api.exits import (
    CONFIG_ERROR_EXIT,
    DONE,
    FAILED,
    JOB_FAILED_EXIT,
    PERMANENT_EXITS,
    SIGNAL_EXIT_BASE,
    STORAGE_ERROR_EXIT,
)
from omnirl.api.failure_policy import count, decide
from omnirl.api.spec import RLJob
from omnirl.launch.procs import RoleProcess
from omnirl.launch.progress import Progress
from omnirl.reward.servers import JudgeProcess
from omnirl.system import disk
from omnirl.transfer import RedisServer, RedisServerError, TransferQueue, start_redis_server
from omnirl.transfer.client import REDIS_AWAY, ping
from omnirl.transfer.heartbeat import past_startup, read_heartbeats
from omnirl.transfer.queue import RECONNECT_S, redis_client
from omnirl.transfer.records import NO_PROGRESS

STATELESS_GRACE_S = 3.0
SETTLE_S = 10.0  # how long a role whose failure the controller reported gets to exit (its code may be permanent)
REDIS_RESTART_S = 30.0  # how long a refused restart of the embedded Redis is retried before the job stops
REDIS_PROBE_S = 2.0  # a manifest's Redis (spec.transferQueue.redisUrl) is PINGed this often
REDIS_PROBE_RETRY_S = 1.0  # the connect timeout of one try of a PING (and of a heartbeat read)
# one retry, each try bounded by REDIS_PROBE_RETRY_S to connect and REDIS_PROBE_S to answer: a down Redis counts as
# down within ~5 s (redis_client's default, 7 retries, took 21 s for a SIGSTOPped one, 4 s for a refused port)
REDIS_PROBE_RETRIES = 1
REDIS_NOTE_S = 30.0  # while it is down, the line saying so is repeated this often
# how long the run waits for it: the roles' own calls retry for RECONNECT_S, after which they fail; a margin more
REDIS_DOWN_S = RECONNECT_S + 30.0
# (role, index, OMNIRL_RESUME) -> a started role process
StartRole = Callable[[str, int, str], RoleProcess]


def clear_start_flags(queue: TransferQueue) -> None:
    """Before the roles start again (`--resume`, `restart-job`): drop the `stop` flag (every new role
    would exit at once), `actor_ready` (the controller must wait for the new actor's broadcast), the
    stopped run's place (`records.STOPPED_RUN`: it runs again) and the `finish` record (`records.FINISHED`):
    the launcher starts roles only when the run directory says work is left (`--resume`'s pre-flight reads
    `metrics.jsonl`; no restart follows the finish line, `_no_longer_needed`), and a record the embedded Redis
    kept while that line was lost made every role exit at once, the missed export never written."""
    queue.records.clear_start_flags()


class JobFailure(Exception):
    """The failure policy gave up: `code` is the launcher's exit code, `reason` names role and cause."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code, self.reason = code, reason


class Supervisor:
    """Runs one local job's roles until the controller finishes.

    Args:
        job: the RLJob (its `failurePolicy`).
        plan: (role, index) of every process, controller last (`placement.role_plan`).
        start: starts one role process with an `OMNIRL_RESUME` value.
        queue: the job's TransferQueue (stop flag, heartbeats).
        out: the run directory (`events.jsonl`, `roles.json`, `metrics.jsonl`).
        total_steps: for the progress bar.
        resume: `OMNIRL_RESUME` of the first start ("auto" with `--resume`: a run stopped before its
            first checkpoint continues from Redis, as after a restart; else "0").
        redis: the embedded Redis to keep alive, or None for an external one.
        judges: the launcher's judge servers (`reward[].server`): `roles.json` names each one's pid as
            `judge-<reward name>` (not supervised: `reward/servers.py` started them and stops them).
    """

    def __init__(self, job: RLJob, plan: list[tuple[str, int]], start: StartRole, queue: TransferQueue, out: Path,
                 total_steps: int, resume: str = "0", redis: RedisServer | None = None,
                 judges: Sequence[JudgeProcess] = ()) -> None:
        self.job, self.plan, self.start, self.queue, self.out = job, plan, start, queue, out
        self.judges = list(judges)
        self.policy = job.spec.failurePolicy
        self.redis = redis
        self.progress = Progress(out / "metrics.jsonl", total_steps)
        self.procs: dict[str, RoleProcess] = {}
        self.restarts: dict[str, int] = {}  # scope (replica name or "job") → restarts so far (`failure_policy.count`)
        self._done: set[str] = set()  # roles that died when the job no longer needed them: not restarted
        self._alone: set[str] = set()  # actors restarted alone for the final validation round (`_final_round_needs`)
        self._resume = resume
        self.failure = ""  # why run() gave up (its JobFailure's reason), for the launcher's last line
        self._verdict: JobFailure | None = None  # set by the Redis watchdog: why the job cannot go on
        self._last_beats = 0.0
        self._alive: dict[tuple[str, int], float] = {}  # (process name, pid) → its last beat, or when first seen
        self._starting: set[tuple[str, int]] = set()  # whose last beat a start-up's or compile's thread wrote
        self._events = (out / "events.jsonl").open("a", buffering=1)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._hurry = threading.Event()  # `hurry`: the grace period of a stop is cut short
        # a manifest's Redis (the embedded one has the watchdog): its own client, whose retries give up within
        # seconds, for the PINGs and heartbeat reads; the queue's client retried 2 minutes per call, in silence
        self._external = job.spec.transferQueue.redisUrl if redis is None else None
        self._probe = redis_client(self._external, retries=REDIS_PROBE_RETRIES, socket_connect_timeout=REDIS_PROBE_RETRY_S,
                                   socket_timeout=REDIS_PROBE_S) if self._external else None
        self._probed = 0.0  # monotonic time of the last PING
        self._down_since: float | None = None  # while the manifest's Redis is down: its last answer (wall clock)
        self._answered = time.time()  # wall-clock time of its last answer
        self._down_said = 0.0  # monotonic time of the last line saying so
        # its own thread: the main loop may sit in a Redis call retrying while the server is down
        self._watchdog = threading.Thread(target=self._watch_redis, daemon=True)
        self._watchdog.start()

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> int:
        """Start every role and supervise until the job finishes; returns the exit code."""
        try:
            for role, index in self.plan:
                self.procs[f"{role}-{index}"] = self.start(role, index, self._resume)
            self._write_pids()
            while True:
                self._pump()
                if self._verdict is not None:
                    raise self._verdict
                if not self._external_redis_answers():
                    time.sleep(0.2)  # a role's exit now is most likely the outage's: handled once it is back
                    continue
                done = self._check_exits()
                if done is not None:
                    return done
                if self.redis is None or self.redis.alive():  # else the watchdog acts; a read would wait for it
                    self._check_heartbeats()
                time.sleep(0.2)
        except JobFailure as failure:  # not printed here: the launcher's last line (its verdict) names it
            self.failure = failure.reason
            return failure.code
        finally:
            self.progress.close()

    def stop_all(self, grace_s: float | None = None) -> list[str]:
        """SIGTERM every role, SIGKILL what is left after the grace period: the actor gets
        `terminationGracePeriodSeconds` to write its checkpoint, the others at most
        `STATELESS_GRACE_S` (their work stays pending in Redis for their successors). After `hurry`
        (a second Ctrl-C) the wait ends at once.

        Returns:
            The names of the roles that were still running at the end of their grace and were SIGKILLed.
        """
        grace = self.policy.terminationGracePeriodSeconds if grace_s is None else grace_s
        for p in self.procs.values():
            p.send_signal(signal.SIGTERM)
        start = time.monotonic()
        while not self._hurry.is_set() and any(
                p.poll() is None and time.monotonic() - start < (grace if p.role == "actor" else
                                                                 min(grace, STATELESS_GRACE_S))
                for p in self.procs.values()):
            self._pump()
            time.sleep(0.2)
        forced = []
        for p in self.procs.values():
            running = p.poll() is None
            p.pump_logs(sys.stdout)
            p.kill(grace_s=0.1)
            if running and p.poll() == -signal.SIGKILL:
                forced.append(p.name)
        if self._hurry.is_set() and forced:
            print(f"omnirl: interrupted again — killed {', '.join(forced)} before they stopped (a stop checkpoint "
                  "not finished is not written; --resume continues from the last complete one)", flush=True)
        return forced

    def hurry(self) -> None:
        """Cut the grace period of the stop under way (and of any later one) short: `stop_all` SIGKILLs
        what is still running at once. Safe from a signal handler (it only sets a flag)."""
        self._hurry.set()

    def close(self) -> None:
        """Stop watching Redis, close the events file."""
        if self._probe is not None:
            self._probe.close()
        self._closed.set()
        self._watchdog.join(timeout=5)
        try:
            self._events.close()
        except OSError as err:  # a line that could not be flushed was reported by _event already
            if disk.storage_error(err) is None:
                raise

    # ------------------------------------------------------------------ checks
    def _pump(self) -> None:
        for p in self.procs.values():
            p.pump_logs(sys.stdout)
        self.progress.update()

    def _check_exits(self) -> int | None:
        """The job's exit code once the controller finished; handles every other exit.

        When roles die together the most specific cause decides: a role's permanent exit (`CONFIG_ERROR_EXIT`,
        `STORAGE_ERROR_EXIT`) before the controller's, whose `FAILED` often only repeats a failure that role reported to it
        (`RoleFailure`) and then exits with itself; a restart cannot help then.
        """
        controller = self.procs["controller-0"]
        code = controller.poll()
        if code == DONE:
            return DONE
        if code is not None and code not in PERMANENT_EXITS:
            self._settle(controller)
        for p in self._roles():
            c = p.poll()
            if c == CONFIG_ERROR_EXIT:
                self._event(p.name, f"exit {c}: {p.last_error()}", "fail-job (configuration error: not restarted)")
                raise JobFailure(c, f"role {p.name} failed: {p.last_error()}")
            if c == STORAGE_ERROR_EXIT:
                self._stop_if_unwritable(p, c)
        if code in (JOB_FAILED_EXIT, CONFIG_ERROR_EXIT):
            raise JobFailure(code, f"role controller failed: {controller.last_error()}")
        if code is not None:
            self._stop_if_unwritable(controller, code)
            self._failed(controller, _exit_reason(controller, code), code)
            return None
        for p in self._roles():
            c = p.poll()
            if c is None or p.name in self._done or (c == DONE and self.queue.records.stop_requested()):
                continue  # running, or finished because the controller ended the job
            self._stop_if_unwritable(p, c)
            why = self._no_longer_needed(p)
            if why and self._final_round_needs(p):
                self._alone.add(p.name)
                self._event(p.name, _exit_reason(p, c), f"restarted alone, not counted against maxRestarts ({why}, "
                            "but the final validation round's rollout workers wait for its weight-sync store)")
                self.procs[p.name] = self.start(p.role, p.index, "auto")
                self._write_pids()
                continue
            if why:
                self._done.add(p.name)
                self._event(p.name, _exit_reason(p, c), f"not restarted ({why})")
                continue
            self._failed(p, _exit_reason(p, c), c)
            return None
        return None

    def _no_longer_needed(self, p: RoleProcess) -> str:
        """Why the job can end without `p`, a role that just died, or "". Restarting it there restarted the
        whole finished job (an actor SIGKILLed after publishing its last step's result: trained again from the
        last checkpoint, exported again as `step-NNNNNN.1`), or with `maxRestarts: 0` failed a job whose
        `finish` record was written. The actor is done once the last step's line is written (its checkpoint
        comes before its result); it died moments before the controller wrote it, so a dead actor whose
        `actor_state` names the last step gets up to `SETTLE_S` for the line."""
        if self.queue.records.stop_requested() or self.progress.finished:
            return "the controller had ended the job"
        last = self.progress.total - 1
        if p.role == "actor":
            state = self.queue.records.actor_state() or NO_PROGRESS
            end = time.monotonic() + (SETTLE_S if state.step >= last else 0.0)
            while self.progress.last_step < last and time.monotonic() < end:
                time.sleep(0.1)
                self._pump()
            if self.progress.last_step >= last:
                return f"the job's last step, {last}, was trained and reported: nothing is left for the actor"
        return ""

    def _final_round_needs(self, p: RoleProcess) -> bool:
        """Whether `p`, an actor that died after the job's last step (`_no_longer_needed`), must come back once for
        the final validation round (`spec.data.validationPrompts`; the controller has not ended the job): a rollout
        worker whose weight-sync connection broke waits for the actor's store before it generates again (its
        receiver's `timeout_s`, 120 s), and did not beat meanwhile. Left dead, the round stalled: measured with
        `maxRestarts: 0` and `progressDeadlineSeconds` 60, rollout-0 was killed for "no progress for 62 s" and the
        run exited 137, "the job did not finish". Restarted alone (`OMNIRL_RESUME=auto`), the actor resumes from
        the last step's checkpoint, which it wrote before its result: nothing is trained again. Once per process;
        a single-rank actor only (a rank restarted alone cannot join its old group: several ranks stay as before)."""
        return (p.role == "actor" and self.job.spec.roles.actor.replicas == 1 and bool(self.job.spec.data.validationPrompts)
                and p.name not in self._alone and not self.progress.finished and not self.queue.records.stop_requested())

    def _roles(self) -> list[RoleProcess]:
        """Every process but the controller's."""
        return [p for name, p in self.procs.items() if name != "controller-0"]

    def _settle(self, controller: RoleProcess) -> None:
        """Give the roles the failed controller names (its last line: `omnirl role controller: actor actor-0 failed:
        …`, a failure that role reported before exiting) up to `SETTLE_S` to exit, so their own exit
        code is seen: the controller's exit was read first and restarted the job until maxRestarts
        while the actor's exit 4 said a restart cannot help."""
        named = [p for p in self._roles() if f" {p.name} failed" in controller.last_error()]
        end = time.monotonic() + SETTLE_S
        while any(p.poll() is None for p in named) and time.monotonic() < end:
            self._pump()
            time.sleep(0.1)

    def _check_heartbeats(self, every_s: float = 2.0) -> None:
        """SIGKILL and handle as failed a live role process whose last beat is older than
        `progressDeadlineSeconds`, or that has not beaten for that long since it was first seen.

        The last beat of each process is remembered here, not only read from Redis: a Redis
        restart can lose the key (or it expires), and a process frozen before its first beat
        (SIGSTOPped while loading) has none; either was taken for "still starting" and never
        replaced (`make chaos` hung on it).
        """
        if time.monotonic() - self._last_beats < every_s:
            return
        self._last_beats = time.monotonic()
        try:
            beats = read_heartbeats(self._probe or self.queue.redis, self.job.metadata.name)
        except (*REDIS_AWAY, OSError) as err:
            if self._probe is None:
                raise
            self._redis_down(err)  # gone since the last PING: the next rounds wait for it
            return
        deadline = self.policy.progressDeadlineSeconds
        now = time.time()
        for name, p in list(self.procs.items()):
            if p.poll() is not None:
                continue  # already handled as an exit
            beat, pid = beats.get(name), p.pid
            if beat is not None and beat["pid"] == pid and beat["t"] > self._alive.get((name, pid), 0.0):
                self._alive[(name, pid)] = beat["t"]
                (self._starting.add if beat.get("startup") else self._starting.discard)((name, pid))
            age = now - self._alive.setdefault((name, pid), now)  # first seen: counts as a beat
            if age > deadline:
                p.send_signal(signal.SIGKILL)
                reason = f"no progress for {age:.0f} s (progressDeadlineSeconds={deadline:g})"
                if (name, pid) in self._starting:  # the covering thread stopped at its bound: that is the knob
                    reason += past_startup(self.policy.startupDeadlineSeconds)
                self._failed(p, reason, 137)
                return

    def _external_redis_answers(self) -> bool:
        """Whether the manifest's Redis (`spec.transferQueue.redisUrl`) answers: PINGed every `REDIS_PROBE_S`
        (`REDIS_PROBE_RETRIES` retry, each try bounded by `REDIS_PROBE_RETRY_S` to connect, `REDIS_PROBE_S` to answer), True for the embedded one (the watchdog's). While it does
        not, a line says since when and what happens next, every `REDIS_NOTE_S`; once it answers again a line
        says so and the roles' beats are counted from then (none could be written meanwhile).

        Raises:
            JobFailure: exit 1, it has not answered for `REDIS_DOWN_S`: the roles' own calls gave up.
        """
        if self._probe is None or time.monotonic() - self._probed < (REDIS_PROBE_S if self._down_since is None
                                                                       else 0.5):
            return self._down_since is None
        self._probed = time.monotonic()
        try:
            ping(self._probe)
        except (*REDIS_AWAY, OSError) as err:
            self._redis_down(err)
            return False
        self._answered = time.time()
        if self._down_since is not None:
            away = self._answered - self._down_since
            self._down_since = None
            self._event("redis", f"{_where(self._external)} answers again after {away:.0f} s", "the run goes on")
            now = time.time()  # no role could beat while it was down: their deadline counts from now
            for key in self._alive:
                self._alive[key] = max(self._alive[key], now)
        return True

    def _redis_down(self, err: BaseException) -> None:
        """Note that the manifest's Redis did not answer (`err`): a line the first time and every `REDIS_NOTE_S`;
        `JobFailure` (exit 1) once it has been down for `REDIS_DOWN_S`."""
        now = time.time()
        if self._down_since is None:
            self._down_since = self._answered  # it went away after its last answer
            self._down_said = 0.0
        away = now - self._down_since
        since = time.strftime("%H:%M:%S", time.localtime(self._down_since))
        where = _where(self._external)
        if away >= REDIS_DOWN_S:
            self._event("redis", f"{where} unreachable: no answer since {since} ({away:.0f} s)", "stop-job")
            raise JobFailure(FAILED, f"{where} (spec.transferQueue.redisUrl) has not answered since {since} ({away:.0f} s, "
                                f"{type(err).__name__}: {err}); the roles' calls give up after {RECONNECT_S:.0f} s; "
                                "start that Redis again (with its data: AOF or RDB), then continue with --resume")
        if time.monotonic() - self._down_said >= REDIS_NOTE_S:
            self._down_said = time.monotonic()
            until = time.strftime("%H:%M:%S", time.localtime(self._down_since + REDIS_DOWN_S))
            print(f"omnirl: Redis at {where} (spec.transferQueue.redisUrl) is unreachable: no answer since {since} "
                  f"({away:.0f} s; "
                  f"{type(err).__name__}: {err}); the roles wait for it (their calls retry for {RECONNECT_S:.0f} s) "
                  f"and so does this run, until {until} ({REDIS_DOWN_S:.0f} s), then it stops (exit 1; --resume "
                  "continues once that Redis is back with its data)", flush=True)

    def _watch_redis(self) -> None:
        """The watchdog thread: restarts the embedded Redis (`_restart_redis`) until `close`. It lives
        until `close` even after a verdict: a server it restarted has it as its parent for the kernel's
        parent-death signal (prctl is per thread), so the server goes down with the launcher, SIGKILLed or
        not, and not before the job's stop. (Restarted without that signal, it outlived a `kill -9` of
        `omnirl run`, parent 1, holding the job's data.)"""
        try:
            self._restart_redis()
        finally:
            self._closed.wait()

    def _restart_redis(self) -> None:
        refused_since = None  # when a restart was first refused (its port taken): retried until REDIS_RESTART_S
        while not self._closed.wait(0.2):
            if self.redis is None or self.redis.alive():
                continue
            what = f"redis-server exited ({_describe(self.redis.process.returncode)})"
            err = disk.unwritable(self.out) or _redis_storage_error(self.redis)
            try:
                if err is None:
                    if refused_since is None:
                        self._event("redis", what, "restart-redis")
                    self.redis = start_redis_server(port=self.redis.port, dir=str(self.redis.dir), aof=True)
                    refused_since = None
                    self._write_pids()
                    continue
            except RedisServerError as refused:  # the roles know this port only: another process may hold it
                refused_since = refused_since or time.monotonic()
                if time.monotonic() - refused_since < REDIS_RESTART_S:
                    self._closed.wait(2.0)  # each refused start appends to the server's log
                    continue
                self._verdict = JobFailure(FAILED, _redis_refused_reason(self.redis.port, refused))
                return
            except JobFailure as failure:  # roles.json: the disk filled after the probe
                self._verdict = failure
                return
            except OSError as raised:  # the server's log or AOF: the disk filled after the probe
                err = disk.storage_error(raised)
                if err is None:
                    raise
            self._verdict = JobFailure(STORAGE_ERROR_EXIT, self._unwritable_reason("redis", what, err))
            return  # a server that cannot append to its AOF would exit again at its first write

    def _stop_if_unwritable(self, p: RoleProcess, code: int) -> None:
        """Stop the job (`JobFailure` with `STORAGE_ERROR_EXIT`) instead of restarting `p`, which
        exited `code`, when the run directory cannot be written: `p` said so itself (exit
        `STORAGE_ERROR_EXIT`), or a probe write fails now (whatever `p` died of: a Redis that could not
        append, a library that wraps the error)."""
        if code == STORAGE_ERROR_EXIT:
            said = p.last_error()
            what = "a file cannot be read" if re.search(r": cannot (read|reach) ", said) else \
                "the run directory cannot be written"  # `disk.failure`'s words in the role's line
            self._event(p.name, f"exit {code}: {said}", f"stop-job ({what}: not restarted)")
            raise JobFailure(code, f"role {p.name} failed: {said}")
        err = disk.unwritable(self.out)
        if err is not None:
            raise JobFailure(STORAGE_ERROR_EXIT, self._unwritable_reason(
                p.name, f"exit {_describe(code)}: {p.last_error()}", err))

    def _unwritable_reason(self, who: str, what: str, err: OSError) -> str:
        """Record `who`'s failure as caused by the unwritable run directory; returns the job's reason."""
        where = f"{self.out} cannot be written ({disk.describe(err)})"
        self._event(who, f"{what}; {where}", "stop-job (the run directory cannot be written: not restarted)")
        return f"{where}; {who}: {what}; {disk.fix(err)}"

    # ------------------------------------------------------------------ actions
    def _failed(self, p: RoleProcess, reason: str, code: int) -> None:
        """Carry out the failure policy's decision (`api/failure_policy.py::decide`: a replica restarted alone is
        its own scope, the process name) for `p`, which failed with `reason` (exit `code`)."""
        decided = decide(self.policy, p.role, p.name, self.restarts)
        if decided.cause == "fail-job":
            raise JobFailure(_exit_code(code), f"role {p.name} failed ({reason}); failurePolicy.{p.role}=fail-job")
        if decided.cause == "exhausted":
            raise JobFailure(_exit_code(code), f"role {p.name} failed ({reason}); {decided.scope} restarted "
                                               f"{decided.used} times already (failurePolicy.maxRestarts="
                                               f"{self.policy.maxRestarts})")
        self.restarts = count(self.restarts, decided)
        self._event(p.name, reason, decided.action, restarts=decided.used + 1)
        if decided.action == "restart-role":
            p.kill(grace_s=0.1)
            self.procs[p.name] = self.start(p.role, p.index, "auto")
        else:
            self.stop_all()
            clear_start_flags(self.queue)
            self._done.clear()
            self._alone.clear()
            for role, index in self.plan:
                self.procs[f"{role}-{index}"] = self.start(role, index, "auto")
        self._write_pids()

    def _event(self, who: str, reason: str, action: str, restarts: int = 0) -> None:
        limit = f" ({restarts}/{self.policy.maxRestarts})" if restarts else ""
        print(f"omnirl: {who}: {reason} → {action}{limit}", flush=True)
        with self._lock:
            try:
                self._events.write(json.dumps({"time": time.time(), "role": who, "reason": reason,
                                               "action": action, "restarts": restarts}) + "\n")
            except OSError as err:  # the console line above stands; the failure itself is what is reported
                if disk.storage_error(err) is None:
                    raise
                print(f"omnirl: {self.out / 'events.jsonl'}: the line above was not recorded ({disk.describe(err)})",
                      flush=True)

    def _write_pids(self) -> None:
        with self._lock:
            pids = {name: p.pid for name, p in list(self.procs.items())}
            if self.redis is not None:
                pids["redis"] = self.redis.pid
            # a judge holds a port and often a GPU: a user reading roles.json to find what the run started
            # (or to `kill -9` one, as docs/local.md suggests) missed it
            pids.update({f"judge-{j.reward.name}": j.proc.pid for j in self.judges})
            tmp = self.out / ".roles.json.tmp"
            try:
                tmp.write_text(json.dumps(pids))
            except OSError as raised:
                err = disk.storage_error(raised)
                if err is None:
                    raise
                raise JobFailure(STORAGE_ERROR_EXIT, f"{tmp} cannot be written ({disk.describe(err)}); "
                                                     f"{disk.fix(err)}") from raised
            tmp.replace(self.out / "roles.json")


def _where(url: str) -> str:
    """`host:port/db` of a Redis URL, never its password."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 6379}{parts.path if parts.path not in ('', '/') else ''}"


def _redis_storage_error(server: RedisServer) -> OSError | None:
    """Why an exited redis-server could not write, when that is why it exited: killed by SIGXFSZ (a
    file past RLIMIT_FSIZE; it does not ignore the signal as Python does), or its log's last lines
    carry a `disk.STORAGE_ERRNOS` text ("Error writing to the AOF file: No space left on device"
    when the disk had room for the log line but not for the AOF write). None otherwise."""
    if server.process.returncode == -signal.SIGXFSZ:
        return OSError(errno.EFBIG, os.strerror(errno.EFBIG))
    try:
        tail = server.log_path.read_text(errors="replace").splitlines()[-5:]
    except OSError:
        return None
    return disk.storage_error(RuntimeError("\n".join(tail)))


def _exit_reason(p: RoleProcess, code: int) -> str:
    """Why a role process ended, for the event line: `exit N: <its last log line>` (a role prints its
    failure reason last). One killed by a signal printed no reason, so its last line — any INFO line — is
    labelled as such instead of reading as the cause (`exit signal SIGKILL: … weight sync v3 … in 0.179 s`)."""
    if code == DONE:
        return f"exit {code}: exited before the job finished"
    if code < 0:
        return f"exit {_describe(code)} (last log line: {p.last_error()})"
    return f"exit {code}: {p.last_error()}"


def _describe(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return str(code)


def _redis_refused_reason(port: int, refused: RedisServerError) -> str:
    """One line for a Redis that could not be started again on its port (the log's last line says why)."""
    lines = str(refused).strip().splitlines()
    last = next((line for line in reversed(lines) if "bind:" in line), lines[-1]).split(" # ")[-1]
    return (f"the embedded Redis exited and could not be started again on 127.0.0.1:{port} for "
            f"{REDIS_RESTART_S:.0f} s ({last}); free the port (e.g. `ss -ltnp | grep {port}`), then continue "
            "with --resume")


def _exit_code(code: int) -> int:
    """A role's exit status as the launcher's: killed by signal N → 128 + N (`SIGNAL_EXIT_BASE`), as a shell
    reports it; a 0 of a role that had to go on → `FAILED`."""
    if code < 0:
        return SIGNAL_EXIT_BASE - code
    return code or FAILED
