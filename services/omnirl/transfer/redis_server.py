"""Start a throw-away ``redis-server`` process: the embedded Redis of local mode and of the tests.

By default the server keeps nothing on disk (``--save '' --appendonly no``); with ``aof=True`` (the
local launcher's embedded Redis) it logs every write to an append-only file in ``dir`` and fsyncs
it per write (``appendfsync always``), so a server restarted on the same ``dir`` — even after
SIGKILL — comes back with every stream, consumer group and marker. It listens on 127.0.0.1 only
and writes its log to ``{dir}/redis-{port}.log``. ``start_redis_server`` returns only once the server
answers PING, and raises with the log's tail when it does not.
"""

from __future__ import annotations

import atexit
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import redis

from omnirl.system.child import STOP_SIGNALS, guarded, stop_child

_INSTALL_HINT = (
    "`redis-server` was not found on PATH; install it (Debian/Ubuntu: `apt-get install redis-server`, "
    "macOS: `brew install redis`) or point the job at a Redis you run (spec.transferQueue.redisUrl)"
)


class RedisServerError(RuntimeError):
    """The redis-server process is missing, exited early or did not answer PING in time."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (the OS picks it; races are retried)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


_BLOCKED_WHILE_FORKING = set(STOP_SIGNALS)
"""Blocked in the launcher while it forks the server: a Ctrl-C inside `Popen` would lose the child (no
`Popen` object, no pid to stop); blocked, it lands once the server's process is known. The guard
(`omnirl.system.child`) unblocks them in the server."""


class RedisServer:
    """A running ``redis-server`` child process. Use as a context manager or call :meth:`stop`.

    Attributes:
        url: ``redis://127.0.0.1:{port}/0``.
        port: the TCP port.
        dir: the working directory (log file; no dumps are written).
        log_path: the server's stdout/stderr.
        process: the ``subprocess.Popen`` handle.
    """

    def __init__(self, process: subprocess.Popen, port: int, dir: Path, log_path: Path, own_dir: bool):
        self.process = process
        self.port = port
        self.host = "127.0.0.1"
        self.dir = dir
        self.log_path = log_path
        self._own_dir = own_dir
        atexit.register(self.stop)

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        """True while the server process has not exited."""
        return self.process.poll() is None

    def stop(self, timeout_s: float = 5.0) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after ``timeout_s`` seconds). Idempotent."""
        stop_child(self.process, timeout_s, kill_wait_s=timeout_s)
        atexit.unregister(self.stop)
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self._own_dir = False

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"RedisServer(url={self.url!r}, pid={self.pid}, alive={self.alive()})"


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _launch(
    binary: str, port: int, workdir: Path, extra_args: Sequence[str], die_with_parent: bool, aof: bool = False
) -> tuple[subprocess.Popen, Path]:
    log_path = workdir / f"redis-{port}.log"
    persistence = ["--appendonly", "yes", "--appendfsync", "always"] if aof else ["--appendonly", "no"]
    cmd = [
        binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", *persistence,
        "--dir", str(workdir), "--daemonize", "no", "--logfile", "", *extra_args,
    ]
    death = signal.SIGTERM if die_with_parent else None  # a crashed launcher leaves no server
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED_WHILE_FORKING)
    try:
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                guarded(cmd, death), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                # its own session: a terminal's Ctrl-C goes to the launcher, which stops the roles first
                start_new_session=True,
            )
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a Ctrl-C during Popen is raised here
    except BaseException:
        process.kill()
        process.wait()
        raise
    return process, log_path


def _wait_ready(process: subprocess.Popen, url: str, log_path: Path, timeout_s: float) -> None:
    """Poll PING until it answers, the process exits, or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
    try:
        while True:
            if process.poll() is not None:
                raise RedisServerError(
                    f"redis-server exited with code {process.returncode} before answering PING; "
                    f"log {log_path}:\n{_log_tail(log_path)}"
                )
            try:
                # PING alone could be answered by another server already bound to a fixed port.
                if client.ping() and int(client.info("server")["process_id"]) == process.pid:
                    return
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                pass
            if time.monotonic() > deadline:
                raise RedisServerError(
                    f"redis-server did not answer PING at {url} within {timeout_s} s; "
                    f"log {log_path}:\n{_log_tail(log_path)}"
                )
            time.sleep(0.02)
    finally:
        client.close()


def start_redis_server(
    port: int | None = None,
    dir: str | None = None,
    *,
    timeout_s: float = 30.0,
    extra_args: Sequence[str] = (),
    die_with_parent: bool = True,
    aof: bool = False,
) -> RedisServer:
    """Start ``redis-server`` on 127.0.0.1 and wait until it answers PING.

    Args:
        port: TCP port; ``None`` picks a free one (retried up to 5 times if another process takes
            it between the pick and the bind).
        dir: working directory for the log file; ``None`` makes a temporary one that
            :meth:`RedisServer.stop` removes.
        timeout_s: seconds to wait for PING before giving up.
        extra_args: more ``redis-server`` arguments, e.g. ``("--maxmemory", "2gb")``.
        aof: persist every write to an append-only file in ``dir`` (fsync per write); a server
            started again on the same ``dir`` reloads it.
        die_with_parent: on Linux, the server gets SIGTERM when the thread that started it exits
            (so a crashed launcher leaves nothing behind); start it from the main thread, or from a
            thread that lives as long as the server should (the launcher's Redis watchdog).

    Returns:
        A :class:`RedisServer`; use ``with start_redis_server() as srv: ... srv.url``.

    Raises:
        RedisServerError: ``redis-server`` is not on PATH (the message names
            ``apt-get install redis-server``), it exited early (e.g. port in use; the message has
            the log's tail), or it did not answer within ``timeout_s``.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisServerError(_INSTALL_HINT)
    own_dir = dir is None
    workdir = Path(tempfile.mkdtemp(prefix="omnirl-redis-") if dir is None else dir)
    workdir.mkdir(parents=True, exist_ok=True)
    attempts = 5 if port is None else 1
    for attempt in range(attempts):
        chosen = free_port() if port is None else port
        process, log_path = _launch(binary, chosen, workdir, extra_args, die_with_parent, aof)
        try:
            _wait_ready(process, f"redis://127.0.0.1:{chosen}/0", log_path, timeout_s)
        except BaseException as err:  # a Ctrl-C while it starts too: no server is left behind
            if process.poll() is None:
                process.kill()
                process.wait()
            if not isinstance(err, RedisServerError) or attempt + 1 == attempts:
                raise  # the message carries the log's tail; the directory is kept for inspection
            continue
        return RedisServer(process, chosen, workdir, log_path, own_dir)
    raise AssertionError("unreachable")  # the loop returns or raises


def _main() -> None:  # pragma: no cover - manual use: python -m omnirl.transfer.redis_server
    with start_redis_server() as server:
        print(server.url, flush=True)
        try:
            server.process.wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":  # pragma: no cover
    _main()
