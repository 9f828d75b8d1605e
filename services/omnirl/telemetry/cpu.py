"""How long this process waited for a CPU: the contention a wall-clock phase time cannot tell apart
from work (a step twice as slow because another job holds the cores does the same work)."""

from __future__ import annotations

from pathlib import Path

_TASKS = Path("/proc/self/task")


def cpu_wait_seconds() -> float | None:
    """Seconds this process's threads have spent runnable but not running (waiting for a CPU held by
    another process or thread), summed over its live threads since each started; None where the
    kernel does not report it (not Linux, or no schedstat). Take differences around a phase.

    Source: field 2 of `/proc/self/task/<tid>/schedstat` (nanoseconds on the run queue). A thread
    that ends between two reads takes its share with it, so a difference can be low, never high.
    """
    total = 0
    try:
        tasks = list(_TASKS.iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except FileNotFoundError:  # the thread ended after the listing
            continue
        except (OSError, IndexError, ValueError):
            return None
    return total / 1e9
