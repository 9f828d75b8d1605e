"""Role processes of a local run: plain subprocesses, or subprocesses placed by Ray.

Either way a role is `python -m omnirl.cli role ROLE --job FILE` with the OMNIRL_* environment —
the same command a pod runs. With Ray, a `RoleHost` actor (0 CPUs reserved, so a 2-core laptop
never deadlocks on placement) starts the process on the node Ray picks and hands its log lines
back to the driver, which prints them with the role's prefix.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path
from typing import TextIO

from omnirl.api.runtime import VARIABLES, usable_cores
from omnirl.system.child import guarded, stop_child

ROLE_VARIABLES = frozenset(VARIABLES.values())


def role_command(role: str, job_file: Path) -> list[str]:
    """The command line of one role."""
    return [sys.executable, "-m", "omnirl.cli", "role", role, "--job", str(job_file)]


class _Child:
    """A subprocess whose merged stdout/stderr is collected by a thread and teed to a log file."""

    def __init__(self, cmd: list[str], env: dict[str, str], log_path: str, die_with_parent: bool = False) -> None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "a", buffering=1)  # noqa: SIM115 - closed in kill()
        # the role's RoleEnv is exactly what the launcher wrote: no OMNIRL_* leaks in from this shell
        inherited = {k: v for k, v in os.environ.items() if k not in ROLE_VARIABLES}
        # A SIGKILLed launcher takes its role processes with it (its Redis goes too, so they could only
        # sit in reconnect retries). SIGKILL, not SIGTERM: what is lost is what any killed role loses,
        # and `--resume` recovers it. A clean stop of the launcher stops the roles first.
        death = signal.SIGKILL if die_with_parent else None
        self.proc = subprocess.Popen(guarded(cmd, death), env={**inherited, **env}, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
        self.lines: deque[str] = deque()
        self.tail: deque[str] = deque(maxlen=50)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        log_ok = True
        for line in self.proc.stdout:
            self.lines.append(line)
            self.tail.append(line)
            if log_ok:
                try:
                    self._log.write(line)
                except OSError as err:  # a full or read-only disk: keep draining the pipe, or the role blocks on it
                    log_ok = False
                    self.lines.append(f"omnirl: {self._log.name}: cannot append ({err.strerror or err}); "
                                      "this role's lines go to the console only\n")

    def take(self) -> list[str]:
        out = []
        while self.lines:
            out.append(self.lines.popleft())
        return out

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None:
            self._reader.join(timeout=2)
        return code

    def pid(self) -> int:
        return self.proc.pid

    def send_signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self, grace_s: float = 5.0) -> None:
        stop_child(self.proc, grace_s)
        self._reader.join(timeout=2)
        try:
            self._log.close()
        except OSError:  # lines it could not flush were announced by _read: the console has them
            pass


class RoleProcess:
    """One running role, local or on a Ray worker. `name` is `role-index`."""

    def __init__(self, role: str, index: int, child) -> None:
        self.role, self.index, self.child = role, index, child
        self.name = f"{role}-{index}"
        self._remote = not isinstance(child, _Child)
        self._code: int | None = None

    def pump_logs(self, out: TextIO) -> None:
        """Print new log lines with the role prefix."""
        lines = self._call("take")
        for line in lines:
            out.write(f"[{self.name}] {line}" if line.endswith("\n") else f"[{self.name}] {line}\n")
        if lines:
            out.flush()

    def poll(self) -> int | None:
        """Exit code, or None while running."""
        if self._code is None:
            self._code = self._call("poll")
        return self._code

    def last_error(self) -> str:
        """The last non-empty log line (the role prints its failure reason last)."""
        tail = self._call("get_tail")
        return next((line.strip() for line in reversed(tail) if line.strip()), "no output")

    def kill(self, grace_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after `grace_s` seconds."""
        self._call("kill", grace_s)

    @property
    def pid(self) -> int:
        """The role's process id (on its node)."""
        return self._call("pid")

    def send_signal(self, sig: int) -> None:
        """Send `sig` to the role process (no-op once it exited)."""
        self._call("send_signal", sig)

    def _call(self, method: str, *args):
        if self._remote:
            import ray

            return ray.get(getattr(self.child, method).remote(*args))
        if method == "get_tail":
            return list(self.child.tail)
        return getattr(self.child, method)(*args)


def init_ray(address: str | None):
    """Connect to Ray (a fresh local instance when `address` is None); returns the context.

    The caller's SIGTERM handler stays in force (ray.init replaces it); a SIGTERM during ray.init runs it.
    """
    import ray

    if ray.is_initialized():
        return ray
    if not address:
        # Ray starts worker processes with niceness 15 by default; our roles are the workload, not
        # background work, and niced roles starve next to any other busy process.
        os.environ.setdefault("RAY_worker_niceness", "0")
    kwargs = {"address": address} if address else {"num_cpus": usable_cores(), "include_dashboard": False}
    # ray.init installs its own SIGTERM handler in the driver first thing (sys.exit(15), later chained to a
    # C++ one that aborts): `omnirl run` SIGTERMed then died with 15 or 134 and no verdict instead of stopping
    # the job the way Ctrl-C does. Ours is put back, and a SIGTERM that Ray's caught meanwhile becomes ours.
    ours = signal.getsignal(signal.SIGTERM)
    try:
        ray.init(log_to_driver=False, configure_logging=False, **kwargs)
    except SystemExit as stop:
        if stop.code != signal.SIGTERM or not callable(ours):
            raise
        ours(signal.SIGTERM, None)  # the launcher's raises KeyboardInterrupt: its interrupted verdict follows
        raise
    finally:
        if ours is not None:
            signal.signal(signal.SIGTERM, ours)
    return ray


def check_ray_address(address: str) -> None:
    """Fail fast on a Ray address nothing answers at: ray.init would otherwise retry for minutes.

    `auto` and `ray://` addresses pass unchecked; host:port must accept a TCP connection.

    Raises:
        ValueError: naming --ray-address and the fix.
    """
    if address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--ray-address {address}: expected host:port (the head node's GCS address), 'auto' or ray://...")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as err:
        raise ValueError(f"--ray-address {address}: nothing accepts connections there ({err.strerror or err}); "
                         "start a cluster with `ray start --head`, or leave --ray-address out for a local one") from None


def _role_host_class():
    import ray

    @ray.remote(num_cpus=0)
    class RoleHost:
        """Runs one role process on this Ray node and hands its output to the driver."""

        def __init__(self, cmd: list[str], env: dict[str, str], log_path: str) -> None:
            self.child = _Child(cmd, env, log_path)

        def take(self) -> list[str]:
            return self.child.take()

        def poll(self) -> int | None:
            return self.child.poll()

        def get_tail(self) -> list[str]:
            return list(self.child.tail)

        def kill(self, grace_s: float = 5.0) -> None:
            self.child.kill(grace_s)

        def pid(self) -> int:
            return self.child.pid()

        def send_signal(self, sig: int) -> None:
            self.child.send_signal(sig)

    return RoleHost


def start_role(role: str, index: int, job_file: Path, env: dict[str, str], log_dir: Path, *,
               use_ray: bool) -> RoleProcess:
    """Start one role process (through Ray when `use_ray`)."""
    cmd = role_command(role, job_file)
    log_path = str(log_dir / f"{role}-{index}.log")
    if use_ray:
        host = _role_host_class().options(name=None).remote(cmd, env, log_path)
        return RoleProcess(role, index, host)
    return RoleProcess(role, index, _Child(cmd, env, log_path, die_with_parent=sys.platform.startswith("linux")))
