"""Judge servers run as local processes (`reward[].server` under `omnirl run` and `omnirl eval`).

`omnirl run` serves them for the roles, `omnirl eval` for its own scoring (:func:`serving`), with
this one code: the same command, so eval scores with the judge the run scored with. Each judge's `command + args` runs as a local process (the `image` is ignored: the command must
exist on this machine) with `{port}` replaced by a free port and `{modelPath}` by
`server.modelPath` (the port is also in its environment, `OMNIRL_JUDGE_PORT`, as in its pod);
its output goes to `OUT/logs/judge-<reward>.log`. The launcher waits until
it answers — `GET healthPath` returns 200, or, without a health path, the port accepts a TCP
connection — for up to `server.startupSeconds` (default 900: a judge may load a large model; the
operator's startup probe allows the same), saying every `WAIT_NOTE_S` what it waits for; a judge
whose process exits first is named at once with its exit code and its log's tail (every judge is
watched while any is awaited: one that died while another loaded waited out the other's bound), and so
is one that listens on a port that is certainly its own but not the one it was given (its command ignores
`{port}`: `listening_ports`, `_hard_coded`), which waited out its whole `startupSeconds` before.
Then it writes the manifest the roles read with the judge's URL wired in
(`http://127.0.0.1:<port><urlPath>`). The servers stop with the job, or the eval (SIGTERM, then SIGKILL).
The run directory's `OUT/job.yaml` keeps `server` (the manifest as written): the wired URL is
this run's, dead once it ends, so the roles read a copy with it (`OUT/job-roles.yaml`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from omnirl.api.spec import RewardSpec, RLJob
from omnirl.reward.registry import check_judges
from omnirl.scorers.judges import argv, judge_rewards, url, wire
from omnirl.system.child import start_guarded, stop_child
from omnirl.transfer.redis_server import free_port

PORT_ENV = "OMNIRL_JUDGE_PORT"  # the port, in the judge's environment as in its pod (operator/judges.py)
WAIT_NOTE_S = 30.0  # while a judge loads, a line this often: what is awaited, for how long yet, its log's last line
TAIL_LINES = 5  # the lines of a failed judge's log printed before the launcher's verdict
PORTS_EVERY_S = 1.0  # how often the ports a loading judge listens on are read (/proc)
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column


class JudgeFailed(RuntimeError):
    """A judge server did not start: its process exited, or it did not answer within `server.startupSeconds`.
    `str()` is one line: the field, what happened, its log's last line and the fix.

    Attributes:
        reward: the name of its `spec.reward[]` entry.
        log: its output file.
        tail: its log's last `TAIL_LINES` lines (for a launcher that prints them).
    """

    def __init__(self, message: str, reward: str, log: Path, tail: list[str] | None = None) -> None:
        super().__init__(message)
        self.reward, self.log, self.tail = reward, log, list(tail or [])


@dataclass
class JudgeProcess:
    """One running judge server."""

    reward: RewardSpec
    port: int
    proc: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        """The URL the reward workers use."""
        return url(self.reward, "127.0.0.1", self.port)

    def answers(self) -> bool:
        """Whether it is ready (health path 200, else the port accepts connections)."""
        path = self.reward.server.healthPath
        if path:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as resp:
                    return resp.status == 200
            except (urllib.error.URLError, OSError):
                return False
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2):
                return True
        except OSError:
            return False

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM its process group, SIGKILL after `grace_s`."""
        stop_child(self.proc, grace_s, group=True)


def _not_startable(i: int, program: str, why: str, by: str) -> str:
    return (f"spec.reward[{i}].server.command: {program!r} cannot be started on this machine ({why}); `{by}` "
            "runs the judge's command here (its image is ignored): install it, put it on PATH or give its full path")


def check_local(job: RLJob, by: str = "omnirl run") -> None:
    """Refuse judge settings a local run (`by`: the command named in the message) cannot honour.

    Raises:
        ValueError: naming `spec.reward[i].server.volume` (a Kubernetes volume), `.modelPath` (missing
            directory) or `.command` (not found on PATH, or not executable: checked here, before Redis
            and Ray start, not when the judge is started after them).
    """
    for i, r in enumerate(job.spec.reward):
        if r.server is None:
            continue
        program = argv(r.server, 0)[0]
        if shutil.which(program) is None:
            raise ValueError(_not_startable(i, program, "not found on PATH, or not an executable file", by))
        if r.server.volume is not None:
            raise ValueError(f"spec.reward[{i}].server.volume: a Kubernetes volume cannot be mounted by `omnirl "
                             "run`; give modelPath (a directory on this machine) to run the judge locally")
        if r.server.modelPath is not None and not Path(r.server.modelPath).is_dir():
            raise ValueError(f"spec.reward[{i}].server.modelPath: {r.server.modelPath} is not a directory here")


def _tail(log: Path) -> list[str]:
    try:
        return log.read_text(errors="replace").splitlines()[-TAIL_LINES:]
    except OSError:
        return []


def _failed(j: JudgeProcess, i: int, what: str, fix: str) -> JudgeFailed:
    tail = _tail(j.log)
    last = next((line.strip() for line in reversed(tail) if line.strip()), "")
    ends = f"its log {j.log} ends: {last!r}" if last else f"its log {j.log} is empty"
    return JudgeFailed(f"spec.reward[{i}].server: judge {j.reward.name} {what}; {ends}; {fix}", j.reward.name, j.log,
                       tail)


def _tree(pid: int) -> set[int]:
    """`pid` and its descendants (a judge's command may be a shell, or a server that forks workers): read from
    /proc; empty where there is none (not Linux)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(") ", 1)[1].split()[1])  # after the command name, which may hold ") "
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in found:
            found.add(p)
            todo += children.get(p, [])
    return found


def listening_ports(pid: int) -> set[int]:
    """TCP ports (IPv4 and IPv6) that process `pid` or one of its descendants listens on, from /proc (Linux;
    elsewhere, or for a process gone meanwhile: empty). A judge told `{port}` that listens elsewhere is named
    by this at once instead of being waited for its whole `startupSeconds`."""
    inodes = set()
    for p in _tree(pid):
        try:
            fds = os.listdir(f"/proc/{p}/fd")
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{p}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()  # sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if len(cols) > 9 and cols[3] == _LISTEN and cols[9] in inodes:
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def _hard_coded(j: JudgeProcess, i: int, ports: set[int], probed: set[int]) -> list[tuple[int, str, bool]]:
    """Of `ports` (where judge `j`, `spec.reward[i]`, listens, not on its given port), those that are certainly
    its own port, with why and whether the number is written in its command: a number written in its command or
    args that does not pass its port on (no `{port}`, `$OMNIRL_JUDGE_PORT` or `$PORT` in them), the manifest's
    `server.port` (the pod's port, default 8000, also the default port of common servers: a command written for
    the pod alone) unless its command passes its port on and writes that number as a port of its own, or, with a
    `healthPath`, a port that answers it (a judge ready on the wrong port; each port asked once, `probed` keeps
    them). Other ports may be a loading server's own (a torch store, a worker's socket) and are only named while
    it waits."""
    written = " ".join(argv(j.reward.server, "{port}"))
    # a command that passes its port on ('{port}', $OMNIRL_JUDGE_PORT, $PORT) listens there: a number written
    # beside it is a port of its own (tritonserver --http-port {port} --grpc-port 8001), not a hard-coded judge port
    given_on = "{port}" in written or re.search(rf"\b({PORT_ENV}|PORT)\b", written) is not None
    pod = j.reward.server.port
    # the default 8000 the user never wrote: naming the field alone sent them to a setting they had not made
    pod_field = (f"spec.reward[{i}].server.port, the pod's port" if "port" in j.reward.server.model_fields_set
                 else f"the default of spec.reward[{i}].server.port, the pod's port")
    sure = []
    for p in sorted(ports):
        in_command = re.search(rf"(?<!\d){p}(?!\d)", written) is not None
        if in_command and not given_on:
            sure.append((p, "a port written into its command" + (f"; {pod} is also {pod_field}" if p == pod else ""),
                         True))
        elif p == pod and not in_command:
            sure.append((p, f"{pod_field}; {p} is nowhere in its command, so it is its program's own default "
                         "port", False))
    path = j.reward.server.healthPath
    for p in sorted(ports - {p for p, _, _ in sure} - probed) if path else []:
        probed.add(p)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{p}{path}", timeout=2) as resp:
                if resp.status == 200:
                    sure.append((p, f"it answers its healthPath {path} there",
                                 re.search(rf"(?<!\d){p}(?!\d)", written) is not None))
        except (urllib.error.URLError, OSError, ValueError):
            pass
    return sure


def _elsewhere(ports: set[int]) -> str:
    return ", ".join(str(p) for p in sorted(ports))


def _await_answers(job: RLJob, judges: list[JudgeProcess], by: str) -> None:
    """Wait until every judge answers, watching all of them each round (0.2 s).

    Raises:
        JudgeFailed: the first judge whose process exited (its code), or that is still running but did not
            answer within its `server.startupSeconds`.
    """
    started = time.monotonic()
    pending = list(judges)
    note_at, ports_at = started + WAIT_NOTE_S, started
    elsewhere: dict[str, set[int]] = {}  # per judge: the ports it listens on, not its own (last read)
    probed: dict[str, set[int]] = {j.reward.name: set() for j in judges}  # ports asked for its healthPath
    while pending:
        read_ports = time.monotonic() >= ports_at
        if read_ports:
            ports_at = time.monotonic() + PORTS_EVERY_S
        for j in list(pending):
            i, code = job.spec.reward.index(j.reward), j.proc.poll()
            if code is not None:  # before `answers`: a port answering for a dead judge is another program's
                raise _failed(j, i, f"exited {code} {time.monotonic() - started:.1f} s after it started, before it "
                              f"answered on port {j.port}", f"fix the judge's command or model "
                              f"(spec.reward[{i}].server), or run the judge yourself and give spec.reward[{i}].url "
                              "instead of server")
            if j.answers():
                pending.remove(j)
                continue
            if read_ports:
                ports = listening_ports(j.proc.pid)
                elsewhere[j.reward.name] = set() if j.port in ports else ports
                wrong = _hard_coded(j, i, elsewhere[j.reward.name], probed[j.reward.name])
                if wrong:  # it would never answer on its port: waiting out startupSeconds (900 s) told nothing
                    port, why, in_command = wrong[0]
                    how = (f"write '{{port}}' where it has {port}" if in_command else "pass it '{port}'")
                    raise _failed(j, i, f"listens on port {port}, not on port {j.port} it was given "
                                  f"{time.monotonic() - started:.1f} s after it started ({why})",
                                  f"its command must listen on the port {by} gives it: {how} (e.g. args: [--port, "
                                  f"'{{port}}']) or read ${PORT_ENV}; on Kubernetes '{{port}}' becomes spec.reward[{i}]."
                                  f"server.port ({j.reward.server.port}), the pod's port")
        now = time.monotonic()
        for j in pending:
            i, bound = job.spec.reward.index(j.reward), j.reward.server.startupSeconds
            if now - started > bound:
                raise _failed(j, i, f"did not answer on port {j.port} within spec.reward[{i}].server.startupSeconds "
                              f"({bound} s) and is still running", "its command must listen on that port: pass it "
                              f"'{{port}}' (e.g. args: [--port, '{{port}}']) or read ${PORT_ENV}; if it only loads for "
                              f"longer, raise spec.reward[{i}].server.startupSeconds")
        if pending and now >= note_at:
            note_at += WAIT_NOTE_S
            for j in pending:
                last = next((line.strip() for line in reversed(_tail(j.log)) if line.strip()), "")
                other = elsewhere.get(j.reward.name)
                print(f"omnirl: judge {j.reward.name} not answering on port {j.port} yet ({now - started:.0f} s of "
                      f"its startupSeconds {j.reward.server.startupSeconds}; {by} stops at once if it exits)"
                      + (f"; it listens on port {_elsewhere(other)} (its command must listen on {j.port}: "
                         f"'{{port}}' or ${PORT_ENV})" if other else "")
                      + (f"; its log ends: {last!r}" if last else ""), flush=True)
        if pending:
            time.sleep(0.2)


def start_judges(job: RLJob, logs: Path, by: str = "omnirl run") -> tuple[list[JudgeProcess], RLJob]:
    """Start every judge of `job` and wait until each answers (each within its `server.startupSeconds`);
    `by` is the command the messages name.

    Returns:
        The running judges and `job` with their URLs wired in (what the roles must read).
    Raises:
        ValueError: from :func:`check_local`, or naming `spec.reward[i].server.command` when the
            command cannot be started here (not found, not executable).
        JudgeFailed: a judge's process exited before it answered (at once, with its exit code), or it did not
            answer within its `startupSeconds`; the others are stopped.
    """
    check_local(job, by)
    judges: list[JudgeProcess] = []
    logs.mkdir(parents=True, exist_ok=True)
    try:
        for r in judge_rewards(job):
            port = free_port()
            log = logs / f"judge-{r.name}.log"
            with log.open("a") as f:
                try:
                    # SIGTERM when the launcher dies, SIGKILLed or not, as its Redis and roles (a judge holds a
                    # GPU; started without it, one outlived a `kill -9` of `omnirl run`, parent 1)
                    proc = start_guarded(argv(r.server, port), signal.SIGTERM, stdout=f, stderr=subprocess.STDOUT,
                                         env={**os.environ, PORT_ENV: str(port), "PORT": str(port),
                                              "PYTHONUNBUFFERED": "1"},
                                         start_new_session=True)
                except OSError as err:  # not installed here, not executable: the user's command, not ours
                    i = job.spec.reward.index(r)
                    raise ValueError(_not_startable(i, argv(r.server, port)[0],
                                                    f"{type(err).__name__}: {err.strerror}", by)) from err
            judges.append(JudgeProcess(r, port, proc, log))
            print(f"omnirl: judge {r.name} starting on port {port} (pid {proc.pid}; it has spec.reward["
                  f"{job.spec.reward.index(r)}].server.startupSeconds, {r.server.startupSeconds} s, to answer): "
                  f"{' '.join(argv(r.server, port))}", flush=True)
        _await_answers(job, judges, by)
    except BaseException:
        stop_judges(judges)
        raise
    return judges, wire(job, {j.reward.name: j.url for j in judges})


def stop_judges(judges: list[JudgeProcess]) -> None:
    """Stop every judge."""
    for j in judges:
        j.stop()


def check_served_judges(wired: RLJob, judges: list[JudgeProcess], by: str = "omnirl run") -> None:
    """`check_judges` of the judges `by` started, whose `url` the user did not write: a refusal
    names the `server` fields it was wired from.

    Raises:
        ValueError: naming `spec.reward[i].url`, then `spec.reward[i].server.urlPath` (an http/vlm
            judge: the path; grpc has none) as the field to fix.
    """
    for j in judges:
        try:
            check_judges(wired.spec.reward, only={j.reward.name})
        except ValueError as err:
            i = [r.name for r in wired.spec.reward].index(j.reward.name)
            fix = ("fix spec.reward[{i}].server.urlPath ({path!r}) or the server's command" if j.reward.kind != "grpc"
                   else "fix the server's command").format(i=i, path=j.reward.server.urlPath)
            raise ValueError(f"{err} [this url is the judge {by} started from spec.reward[{i}].server: "
                             f"{fix}]") from err


@contextmanager
def serving(job: RLJob, logs: Path, by: str) -> Iterator[RLJob]:
    """Serve `job`'s judges (`reward[].server`) while the block runs; yields `job` with their URLs
    wired in (`job` itself when it has none), and stops them on the way out, however it is left.

    Raises:
        ValueError: as `start_judges` and `check_served_judges`.
        JudgeFailed: as `start_judges`.
    """
    judges, wired = start_judges(job, logs, by) if judge_rewards(job) else ([], job)
    try:
        check_served_judges(wired, judges, by)
        yield wired
    finally:
        stop_judges(judges)
