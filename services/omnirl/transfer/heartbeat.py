"""Role liveness in Redis: every role's main loop beats; the controller and the launcher read them.

A beat is ``omnirl:{job}:kv:heartbeat:{worker}`` = ``{"role", "worker", "pid", "t", "progress"}``
(``t`` in Unix seconds, ``progress`` a counter the role bumps when it finishes a unit of work), and
``"startup": true`` when a start-up's or a torch.compile's covering thread wrote it (so a role
found stale after one names `startupDeadlineSeconds`, not only `progressDeadlineSeconds`).
A beat is written at most once a second, so it costs one SET per second per role. A role whose
last beat is older than ``failurePolicy.progressDeadlineSeconds`` is stuck (a hung scorer, a
SIGSTOPped process, a dead node): see :func:`stale_roles`. Work that may legitimately outlast
that deadline, bounded by its own limit, runs under :meth:`Heartbeat.covering`, which beats from
a thread for at most that bound: a slow remote scorer's call (its timeouts), a role's start-up and
every torch.compile (`failurePolicy.startupDeadlineSeconds`, `omnirl.models.compile.while_compiling`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis

from omnirl.transfer.keys import kv_key

HEARTBEAT = "heartbeat"
log = logging.getLogger("omnirl.heartbeat")


class Heartbeat:
    """Writes one role's beats.

    Args:
        client: a Redis client.
        job: the job name.
        role: ``rollout``, ``reward``, ``actor`` or ``controller``.
        worker: the replica id (``OMNIRL_WORKER_ID``).
        every_s: the least seconds between two writes.
        ttl_s: seconds a beat lives: pass twice `progressDeadlineSeconds`, so a replaced replica's
            (a new pod name) last beat is reported stale for a while, then disappears.
    """

    def __init__(self, client: redis.Redis, job: str, role: str, worker: str, every_s: float = 1.0,
                 ttl_s: float = 1200.0) -> None:
        self.client, self.role, self.worker, self.every_s, self.ttl_s = client, role, worker, every_s, ttl_s
        self.key = kv_key(job, f"{HEARTBEAT}:{worker}")
        self.progress = 0
        self.last = 0.0  # monotonic time of the last write
        self._lock = threading.Lock()  # `covering`'s thread beats too

    def beat(self, progressed: bool = False, *, startup: bool = False) -> None:
        """Note the loop is alive (and, with ``progressed``, that a unit of work finished; ``startup``:
        written for a start-up or a compilation, see `start_covering`)."""
        with self._lock:
            self.progress += int(progressed)
            now = time.monotonic()
            if now - self.last < self.every_s:
                return
            doc = {"role": self.role, "worker": self.worker, "pid": os.getpid(), "t": time.time(),
                   "progress": self.progress}
            if startup:
                doc["startup"] = True
            self.client.set(self.key, json.dumps(doc).encode(), px=int(self.ttl_s * 1000))
            self.last = now

    @contextmanager
    def covering(self, bound_s: float) -> Iterator[None]:
        """Beat from a thread while the block runs, for at most `bound_s` seconds.

        For work whose own bound says how long it may take, which may be longer than
        `progressDeadlineSeconds`: a remote scorer's attempts, its backoffs and the request that
        measures a slow one (minutes, `omnirl.reward.slow`); a role's start-up (its model load,
        `failurePolicy.startupDeadlineSeconds`). The role is alive, waiting, not stuck. Past
        `bound_s` the thread stops beating, so work stuck beyond its own bound is still reported
        stale once `progressDeadlineSeconds` more have passed. `bound_s` <= 0: no thread.
        """
        stop = self.start_covering(bound_s)
        try:
            yield
        finally:
            stop()

    def start_covering(self, bound_s: float, *, startup: bool = False) -> Callable[[], None]:
        """`covering` for work whose start and end are two calls (torch.compile's callbacks): beats
        from a thread for at most `bound_s` seconds from now; returns the function that stops it.
        ``startup``: the work is a start-up or a compilation, bound by
        `failurePolicy.startupDeadlineSeconds` (the beats say so: see the module docstring)."""
        if bound_s <= 0:
            return lambda: None
        done = threading.Event()
        until = time.monotonic() + bound_s

        def keep_alive() -> None:
            warned = False
            while not done.wait(self.every_s) and time.monotonic() < until:
                try:
                    self.beat(startup=startup)
                except redis.RedisError as err:  # Redis away: the role's own next call meets it and handles it
                    if not warned:
                        log.warning("heartbeat of %s not written (%s); trying again every %g s", self.worker, err,
                                    self.every_s)
                    warned = True

        thread = threading.Thread(target=keep_alive, name=f"heartbeat-{self.worker}", daemon=True)
        thread.start()

        def stop() -> None:
            done.set()
            thread.join()

        return stop

    def age_s(self) -> float:
        """Seconds since this process last wrote a beat (its own view; the health probe reads it)."""
        return time.monotonic() - self.last if self.last else 0.0


def read_heartbeats(client: redis.Redis, job: str) -> dict[str, dict]:
    """Every role's last beat, keyed by worker id."""
    out = {}
    for key in client.scan_iter(match=kv_key(job, f"{HEARTBEAT}:*"), count=100):
        raw = client.get(key)
        if raw is not None:
            doc = json.loads(raw)
            out[doc["worker"]] = doc
    return out


def last_beats(beats: dict[str, dict], role: str, now: float | None = None) -> str:
    """``worker last beat N s ago[ while starting]`` for each of `role`'s workers in `beats`
    (`read_heartbeats`), sorted, or that none is there: not started yet, or gone for over twice
    `progressDeadlineSeconds` (the key's TTL). For a line of a role that waits on `role`."""
    now = time.time() if now is None else now
    mine = sorted((b for b in beats.values() if b.get("role") == role), key=lambda b: b["worker"])
    if not mine:
        return f"no {role} heartbeat in Redis (not started yet, or gone)"
    return ", ".join(f"{b['worker']} last beat {max(now - b['t'], 0):.0f} s ago"
                     + (" while starting" if b.get("startup") else "") for b in mine)


def past_startup(startup_deadline_s: float) -> str:
    """What a stale role's reason adds when its last beat was a start-up's or a compile's
    (``"startup": true``): the bound that ran out, the knob to raise, not `progressDeadlineSeconds`."""
    return (f" after its start-up or a torch.compile ran past failurePolicy.startupDeadlineSeconds="
            f"{startup_deadline_s:g} (raise it if loading or compiling takes longer)")


def stalled_text(beats: dict[str, dict], deadline_s: float, startup_deadline_s: float, *, skip: str = "",
                 now: float | None = None) -> str:
    """The RLJob's ``status.stalled``: ``worker: no heartbeat for N s`` per stale worker but ``skip``
    (the writer itself), sorted, joined by ``; ``, with :func:`past_startup` for a start-up's beat."""
    stale = stale_roles(beats, deadline_s, now)
    return "; ".join(f"{w}: no heartbeat for {age:.0f} s" + (past_startup(startup_deadline_s)
                                                              if beats[w].get("startup") else "")
                     for w, age in sorted(stale.items()) if w != skip)


def stale_roles(beats: dict[str, dict], deadline_s: float, now: float | None = None) -> dict[str, float]:
    """Workers whose last beat is older than ``deadline_s`` → the age of that beat in seconds."""
    now = time.time() if now is None else now
    return {w: now - b["t"] for w, b in beats.items() if now - b["t"] > deadline_s}
