"""Judge servers run as local processes (`reward[].server` under `omnirl run` and `omnirl eval`).

`omnirl run` serves them for the roles, `omnirl eval` for its own scoring (:func:`serving`), with
this one code: the same command, so eval scores with the judge the run scored with. Each judge's `command + args` runs as a local process (the `image` is ignored: the command must
exist on this machine) with `{port}` replaced by a free port and `{modelPath}` by
`server.modelPath` (the port is also in its environment, `OMNIRL_JUDGE_PORT`, as in its pod);
its output goes to `OUT/logs/judge-<reward>.log`. The launcher waits until
it answers — `GET healthPath` returns 200, or, without a health path, the port accepts a TCP
connection — then writes the manifest the roles read with the judge's URL wired in
(`http://127.0.0.1:<port><urlPath>`). The servers stop with the job, or the eval (SIGTERM, then SIGKILL).
The run directory's `OUT/job.yaml` keeps `server` (the manifest as written): the wired URL is
this run's, dead once it ends, so the roles read a copy with it (`OUT/job-roles.yaml`).
"""

from __future__ import annotations

import os
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

from omnirl.api.child import start_guarded
from omnirl.api.judges import argv, judge_rewards, url, wire
from omnirl.api.spec import RewardSpec, RLJob
from omnirl.reward.registry import check_judges
from omnirl.transfer.redis_server import free_port

READY_TIMEOUT_S = 600.0  # a judge may load a large model
PORT_ENV = "OMNIRL_JUDGE_PORT"  # the port, in the judge's environment as in its pod (operator/judges.py)


class JudgeFailed(RuntimeError):
    """A judge server did not start (exited, or never answered).

    Attributes:
        reward: the name of its `spec.reward[]` entry.
        log: its output file.
    """

    def __init__(self, message: str, reward: str, log: Path) -> None:
        super().__init__(message)
        self.reward, self.log = reward, log


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
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


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


def start_judges(job: RLJob, logs: Path, timeout_s: float = READY_TIMEOUT_S,
                 by: str = "omnirl run") -> tuple[list[JudgeProcess], RLJob]:
    """Start every judge of `job` and wait until each answers; `by` is the command the messages name.

    Returns:
        The running judges and `job` with their URLs wired in (what the roles must read).
    Raises:
        ValueError: from :func:`check_local`, or naming `spec.reward[i].server.command` when the
            command cannot be started here (not found, not executable).
        JudgeFailed: a judge exited or did not answer within `timeout_s` (the others are stopped).
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
            print(f"omnirl: judge {r.name} starting on port {port} (pid {proc.pid}): {' '.join(argv(r.server, port))}",
                  flush=True)
        deadline = time.monotonic() + timeout_s
        for j in judges:
            while not j.answers():
                if j.proc.poll() is not None:
                    tail = "\n".join(j.log.read_text().splitlines()[-5:])
                    raise JudgeFailed(f"judge {j.reward.name} exited {j.proc.returncode} before answering:\n{tail}",
                                      j.reward.name, j.log)
                if time.monotonic() > deadline:
                    raise JudgeFailed(f"judge {j.reward.name} did not answer on port {j.port} in {timeout_s:.0f} s "
                                      f"(log: {j.log}); its command must listen on that port: pass it '{{port}}' "
                                      f"(e.g. args: [--port, '{{port}}']) or read ${PORT_ENV}", j.reward.name, j.log)
                time.sleep(0.2)
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
def serving(job: RLJob, logs: Path, by: str, timeout_s: float = READY_TIMEOUT_S) -> Iterator[RLJob]:
    """Serve `job`'s judges (`reward[].server`) while the block runs; yields `job` with their URLs
    wired in (`job` itself when it has none), and stops them on the way out, however it is left.

    Raises:
        ValueError: as `start_judges` and `check_served_judges`.
        JudgeFailed: as `start_judges`.
    """
    judges, wired = start_judges(job, logs, timeout_s, by) if judge_rewards(job) else ([], job)
    try:
        check_served_judges(wired, judges, by)
        yield wired
    finally:
        stop_judges(judges)
