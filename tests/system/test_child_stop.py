"""`omnirl.system.child.stop_child`: how the launcher stops a role process, the embedded Redis and a judge server
(SIGTERM, SIGKILL after the grace), with real child processes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from omnirl.system.child import stop_child

IGNORES_SIGTERM = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"


def _started(code: str, **popen) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, **popen)
    assert proc.stdout.readline().strip() == "up"  # its handler is set before it is signalled
    return proc


def test_a_child_that_stops_on_sigterm_is_not_killed():
    proc = _started("import time; print('up', flush=True); time.sleep(60)")
    t0 = time.monotonic()
    stop_child(proc, grace_s=30)
    assert proc.returncode == -signal.SIGTERM and time.monotonic() - t0 < 10
    stop_child(proc, grace_s=30)  # exited already: nothing to do
    assert proc.returncode == -signal.SIGTERM


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace():
    proc = _started(IGNORES_SIGTERM)
    t0 = time.monotonic()
    stop_child(proc, grace_s=0.5, kill_wait_s=10)
    assert proc.returncode == -signal.SIGKILL and 0.5 <= time.monotonic() - t0 < 10


def test_group_stops_the_childs_own_children_too():
    code = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
            " print(c.pid, flush=True); print('up', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    grandchild = int(proc.stdout.readline())
    assert proc.stdout.readline().strip() == "up"
    stop_child(proc, grace_s=10, group=True)
    assert proc.returncode == -signal.SIGTERM
    deadline = time.monotonic() + 10
    while _alive(grandchild):
        assert time.monotonic() < deadline, f"grandchild {grandchild} outlived its group's stop"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Running: neither gone nor a zombie (a container's pid 1 may never reap the orphan)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
