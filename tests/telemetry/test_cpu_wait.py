"""CPU contention, told apart from work: the run-queue wait behind `train_cpu_wait_seconds` and the
console note it adds to a slowed step's line (a resumed run's first step measured 23.7 s against
4 s while other jobs held the 2 cores; the same work took 0.9 s alone, fresh or resumed)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from omnirl.controller.report import contention_note, step_line
from omnirl.telemetry import cpu
from omnirl.telemetry.cpu import cpu_wait_seconds

SPIN = "import os, time\nos.sched_setaffinity(0, {%d})\nt = time.time()\nwhile time.time() - t < %f: pass\n"


def _spin(seconds: float) -> None:
    t = time.time()
    while time.time() - t < seconds:
        pass


@pytest.mark.skipif(cpu_wait_seconds() is None or not hasattr(os, "sched_setaffinity"), reason="no schedstat")
def test_a_process_sharing_its_cpu_with_two_busy_ones_waits_about_two_thirds_of_the_time():
    mine = os.sched_getaffinity(0)
    core = min(mine)
    os.sched_setaffinity(0, {core})
    try:
        others = [subprocess.Popen([sys.executable, "-c", SPIN % (core, 3.0)]) for _ in range(2)]
        time.sleep(0.5)  # the other processes are spinning on our core
        start = time.monotonic()
        before = cpu_wait_seconds()
        _spin(1.0)
        waited = cpu_wait_seconds() - before
        window = time.monotonic() - start  # over 1 s when other jobs keep us off the core between the reads
        for other in others:
            other.wait()
    finally:
        os.sched_setaffinity(0, mine)
    # three runnable processes on one core: each runs about 1/3 of the 1 s and waits 2/3 (more if other
    # jobs share the core); the time it ran (schedstat's first field) would be about 0.33. A wait is never
    # longer than the wall time between the two reads (it was 1.23 s once, over a fixed 1.2 s bound, under load 7)
    assert 0.55 < waited <= window + 0.01


def test_no_schedstat_is_none_not_zero(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu, "_TASKS", tmp_path / "absent")
    assert cpu_wait_seconds() is None
    task = tmp_path / "task" / "1"
    task.mkdir(parents=True)
    (task / "schedstat").write_text("garbage\n")
    monkeypatch.setattr(cpu, "_TASKS", tmp_path / "task")
    assert cpu_wait_seconds() is None
    (task / "schedstat").write_text("575689 2500000000 1\n")
    assert cpu_wait_seconds() == 2.5


def test_a_step_slowed_by_busy_cores_says_so_and_a_normal_one_adds_nothing():
    record = {"reward_mean": 0.493, "reward_std": 0.228, "step_seconds": 23.7, "images_per_second": 2.7,
              "train_seconds": 11.08, "train_cpu_wait_seconds": 9.04}
    assert step_line(2, 4, 3, record) == ("step 2 [3/4] reward 0.493±0.228  23.7 s  2.7 img/s  v3  actor threads "
                                          "waited 9.0 s for a CPU (the cores were busy with other work)")
    assert contention_note({**record, "train_cpu_wait_seconds": 0.4}) == ""  # an idle box: no note
    assert contention_note({**record, "train_cpu_wait_seconds": 3.0}) == ""  # under half the phase
    assert contention_note({"train_seconds": 1.5, "train_cpu_wait_seconds": 0.9}) == ""  # under 1 s
    assert contention_note({"train_seconds": 11.0}) == ""  # not measured (not Linux)
