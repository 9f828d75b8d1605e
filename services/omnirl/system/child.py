"""Child processes started without running Python between fork and exec.

`subprocess.Popen(preexec_fn=...)` runs Python in the forked child of a multi-threaded parent, which
CPython documents as unsafe: the child first clears the other threads' states, and their
thread-locals' destructors can wait on locks no thread will release. Seen in CI: a torch
thread-local cache holding a gloo ProcessGroup ran `~ProcessGroupGloo` in the child, which blocked
in `pthread_cond_destroy`; the child never exec'd and `Popen` waited on it forever.

So the work a `preexec_fn` did runs after exec instead, in a fresh single-threaded interpreter
(`python -I -S -c GUARD`, ~20 ms) that then execs the real command under the same pid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""Set to their default action and unblocked in every guarded child: a launcher blocks them while it
forks (so a Ctrl-C lands once the child's pid is known), a shell without job control ignores SIGINT,
and a child must still stop on either."""

_GUARD = """\
import os, signal, sys
parent, death, report = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[4])
stop = [signal.Signals(int(s)) for s in sys.argv[3].split(",")]
for s in stop:
    signal.signal(s, signal.SIG_DFL)
for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ"):  # Python ignores these; exec would keep them ignored
    if hasattr(signal, name):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
signal.pthread_sigmask(signal.SIG_UNBLOCK, stop)
if death:
    import ctypes
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, death)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not glibc: the launcher's own stop paths remain
    if os.getppid() != parent:  # the parent died before the prctl: nobody would send the signal
        os.kill(os.getpid(), death)
if report < 0:
    os.execvp(sys.argv[5], sys.argv[5:])
os.set_inheritable(report, False)  # closed by a successful exec: the starter reads EOF
try:
    os.execvp(sys.argv[5], sys.argv[5:])
except OSError as err:  # as Popen reports it: the errno, to be raised in the starter
    os.write(report, f"{err.errno} {err.strerror}".encode())
    os._exit(127)
"""


def guarded(cmd: Sequence[str], parent_death_signal: int | None = None, report_fd: int = -1) -> list[str]:
    """The command line that runs ``cmd`` as a guarded child of this process.

    The guard resets :data:`STOP_SIGNALS` to their default action and unblocks them, restores the default
    action of SIGPIPE and SIGXFSZ (which its own interpreter ignores, like ``Popen(restore_signals=True)``:
    a redis-server past RLIMIT_FSIZE must die of SIGXFSZ, not go on with EFBIG), on Linux asks the
    kernel (prctl ``PR_SET_PDEATHSIG``) to send ``parent_death_signal`` to the child when the thread
    that started it exits, then execs ``cmd`` (same pid, so ``Popen.pid`` is the command's). Start the
    result with a plain ``subprocess.Popen`` (no ``preexec_fn``).

    Args:
        cmd: program and arguments; the program is looked up on PATH like ``execvp``.
        parent_death_signal: e.g. ``signal.SIGTERM``; ``None`` sends nothing when the parent dies.
        report_fd: a pipe's write end passed to the child (``pass_fds``) on which the guard writes
            ``"ERRNO STRERROR"`` when ``cmd`` cannot be executed; -1: none (``start_guarded`` uses it).

    Returns:
        ``[sys.executable, "-I", "-S", "-c", GUARD, parent_pid, signal, stop_signals, report_fd, *cmd]``.

    Raises:
        ValueError: ``cmd`` is empty.
    """
    if not cmd:
        raise ValueError("guarded() needs a program to run; got an empty command")
    death = int(parent_death_signal) if parent_death_signal and sys.platform.startswith("linux") else 0
    stop = ",".join(str(int(s)) for s in STOP_SIGNALS)
    return [sys.executable, "-I", "-S", "-c", _GUARD, str(os.getpid()), str(death), stop, str(report_fd), *cmd]


def start_guarded(cmd: Sequence[str], parent_death_signal: int | None = None, **popen: object) -> subprocess.Popen:
    """``subprocess.Popen(guarded(cmd, parent_death_signal), **popen)`` that raises as ``Popen(cmd)`` would
    when ``cmd`` cannot be executed (not found, not executable, not a program the kernel runs): the guard
    writes the exec's errno on a close-on-exec pipe, read here until the exec closes it. Without it, a
    guarded command that cannot run is only a child exiting 127 with a traceback in its log.

    Raises:
        OSError: (or its subclass for the errno, e.g. ``PermissionError``) naming ``cmd[0]``; the guard has exited.
        ValueError: ``cmd`` is empty; ``popen`` holds ``pass_fds`` (the pipe is passed here).
    """
    if "pass_fds" in popen:
        raise ValueError("start_guarded passes its own pipe to the child: pass_fds is not supported")
    read, write = os.pipe()
    try:
        proc = subprocess.Popen(guarded(cmd, parent_death_signal, write), pass_fds=(write,), **popen)
    finally:
        os.close(write)
    with os.fdopen(read, "rb") as pipe:
        failed = pipe.read()  # b"" once the exec closed the pipe (or the guard died before it)
    if failed:
        proc.wait()
        number, _, text = failed.decode().partition(" ")
        raise OSError(int(number), text, cmd[0])
    return proc


def stop_child(proc: subprocess.Popen, grace_s: float, *, group: bool = False, kill_wait_s: float | None = None
               ) -> None:
    """Stop a child: SIGTERM, then SIGKILL when it has not exited after `grace_s` seconds; nothing when it has
    exited already (so it is idempotent).

    Args:
        group: signal its process group (`os.killpg`: a child started in a session of its own, whose own children
            go with it), not only the process.
        kill_wait_s: after a SIGKILL, wait at most this long (None: until it exits).
    Raises:
        subprocess.TimeoutExpired: still there `kill_wait_s` after the SIGKILL (a process in uninterruptible sleep).
    """
    if proc.poll() is not None:
        return
    send = (lambda sig: os.killpg(proc.pid, sig)) if group else proc.send_signal
    send(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait(timeout=kill_wait_s)
