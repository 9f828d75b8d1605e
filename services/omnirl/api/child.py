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
import sys
from collections.abc import Sequence

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""Set to their default action and unblocked in every guarded child: a launcher blocks them while it
forks (so a Ctrl-C lands once the child's pid is known), a shell without job control ignores SIGINT,
and a child must still stop on either."""

_GUARD = """\
import os, signal, sys
parent, death = int(sys.argv[1]), int(sys.argv[2])
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
os.execvp(sys.argv[4], sys.argv[4:])
"""


def guarded(cmd: Sequence[str], parent_death_signal: int | None = None) -> list[str]:
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

    Returns:
        ``[sys.executable, "-I", "-S", "-c", GUARD, parent_pid, signal, stop_signals, *cmd]``.

    Raises:
        ValueError: ``cmd`` is empty.
    """
    if not cmd:
        raise ValueError("guarded() needs a program to run; got an empty command")
    death = int(parent_death_signal) if parent_death_signal and sys.platform.startswith("linux") else 0
    stop = ",".join(str(int(s)) for s in STOP_SIGNALS)
    return [sys.executable, "-I", "-S", "-c", _GUARD, str(os.getpid()), str(death), stop, *cmd]
