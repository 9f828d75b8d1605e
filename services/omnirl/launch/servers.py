"""Judge servers of a local run (`reward[].server` under `omnirl run`).

Each judge's `command + args` runs as a local process (the `image` is ignored: the command must
exist on this machine) with `{port}` replaced by a free port and `{modelPath}` by
`server.modelPath` (the port is also in its environment, `OMNIRL_JUDGE_PORT`, as in its pod);
its output goes to `OUT/logs/judge-<reward>.log`. The launcher waits until
it answers — `GET healthPath` returns 200, or, without a health path, the port accepts a TCP
connection — then writes the manifest the roles read with the judge's URL wired in
(`http://127.0.0.1:<port><urlPath>`). The servers stop with the job (SIGTERM, then SIGKILL).
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
from dataclasses import dataclass
from pathlib import Path

from omnirl.api.child import start_guarded
from omnirl.api.judges import argv, judge_rewards, url, wire
from omnirl.api.spec import RewardSpec, RLJob
from omnirl.transfer.redis_server import free_port

READY_TIMEOUT_S = 600.0  # a judge may load a large model
PORT_ENV = "OMNIRL_JUDGE_PORT"  # the port, in the judge's environment as in its pod (operator/judges.py)


class JudgeFailed(RuntimeError):
    """A judge server did not start (exited, or never answered)."""


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


def _not_startable(i: int, program: str, why: str) -> str:
    return (f"spec.reward[{i}].server.command: {program!r} cannot be started on this machine ({why}); `omnirl run` "
            "runs the judge's command here (its image is ignored): install it, put it on PATH or give its full path")


def check_local(job: RLJob) -> None:
    """Refuse judge settings a local run cannot honour.

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
            raise ValueError(_not_startable(i, program, "not found on PATH, or not an executable file"))
        if r.server.volume is not None:
            raise ValueError(f"spec.reward[{i}].server.volume: a Kubernetes volume cannot be mounted by `omnirl "
                             "run`; give modelPath (a directory on this machine) to run the judge locally")
        if r.server.modelPath is not None and not Path(r.server.modelPath).is_dir():
            raise ValueError(f"spec.reward[{i}].server.modelPath: {r.server.modelPath} is not a directory here")


def start_judges(job: RLJob, logs: Path, timeout_s: float = READY_TIMEOUT_S) -> tuple[list[JudgeProcess], RLJob]:
    """Start every judge of `job` and wait until each answers.

    Returns:
        The running judges and `job` with their URLs wired in (what the roles must read).
    Raises:
        ValueError: from :func:`check_local`, or naming `spec.reward[i].server.command` when the
            command cannot be started here (not found, not executable).
        JudgeFailed: a judge exited or did not answer within `timeout_s` (the others are stopped).
    """
    check_local(job)
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
                                                    f"{type(err).__name__}: {err.strerror}")) from err
            judges.append(JudgeProcess(r, port, proc, log))
            print(f"omnirl: judge {r.name} starting on port {port}: {' '.join(argv(r.server, port))}", flush=True)
        deadline = time.monotonic() + timeout_s
        for j in judges:
            while not j.answers():
                if j.proc.poll() is not None:
                    tail = "\n".join(j.log.read_text().splitlines()[-5:])
                    raise JudgeFailed(f"judge {j.reward.name} exited {j.proc.returncode} before answering:\n{tail}")
                if time.monotonic() > deadline:
                    raise JudgeFailed(f"judge {j.reward.name} did not answer on port {j.port} in {timeout_s:.0f} s "
                                      f"(log: {j.log}); its command must listen on that port: pass it '{{port}}' "
                                      f"(e.g. args: [--port, '{{port}}']) or read ${PORT_ENV}")
                time.sleep(0.2)
    except BaseException:
        stop_judges(judges)
        raise
    return judges, wire(job, {j.reward.name: j.url for j in judges})


def stop_judges(judges: list[JudgeProcess]) -> None:
    """Stop every judge."""
    for j in judges:
        j.stop()
