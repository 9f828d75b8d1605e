"""Role liveness in Redis: every role's main loop beats; the controller and the launcher read them.

A beat is ``omnirl:{job}:kv:heartbeat:{worker}`` = ``{"role", "worker", "pid", "t", "progress"}``
(``t`` in Unix seconds, ``progress`` a counter the role bumps when it finishes a unit of work).
A beat is written at most once a second, so it costs one SET per second per role. A role whose
last beat is older than ``failurePolicy.progressDeadlineSeconds`` is stuck (a hung scorer, a
SIGSTOPped process, a dead node): see :func:`stale_roles`.
"""

from __future__ import annotations

import json
import os
import time

import redis

from omnirl.transfer.keys import kv_key

HEARTBEAT = "heartbeat"


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

    def beat(self, progressed: bool = False) -> None:
        """Note the loop is alive (and, with ``progressed``, that a unit of work finished)."""
        self.progress += int(progressed)
        now = time.monotonic()
        if now - self.last < self.every_s:
            return
        doc = {"role": self.role, "worker": self.worker, "pid": os.getpid(), "t": time.time(),
               "progress": self.progress}
        self.client.set(self.key, json.dumps(doc).encode(), px=int(self.ttl_s * 1000))
        self.last = now

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


def stale_roles(beats: dict[str, dict], deadline_s: float, now: float | None = None) -> dict[str, float]:
    """Workers whose last beat is older than ``deadline_s`` → the age of that beat in seconds."""
    now = time.time() if now is None else now
    return {w: now - b["t"] for w, b in beats.items() if now - b["t"] > deadline_s}
