"""Who runs a job on its Redis: the run-owner record, written by whoever started the run.

A job's keys are ``omnirl:{job}:*`` (`keys.py`), so two runs of one name on one Redis — an `omnirl run`
and an RLJob on a shared Redis, or RLJobs of one name in two namespaces or clusters — read and write the
same streams, and a fresh start deletes the other's keys. The heartbeats say that the job runs, not who
runs it: the operator could not tell its own RLJob's pods from a local run's roles. This record is the
one fact that says who: ``omnirl:{job}:kv:run_owner`` =

- ``{"kind": "omnirl run", "host", "out", "pid", "time"}``: written by the launcher once the run starts
  (`launch/local.py`), without a TTL; the run is live while its roles beat and no ``stop`` flag is set;
- ``{"kind": "RLJob", "namespace", "name", "uid", "time"}``: written by the operator on every reconcile
  of a running RLJob, with a TTL of `OWNER_TTL_S` (it lapses once no operator reconciles that RLJob).

Plain redis-py and json, no torch: the operator imports it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

import redis

from omnirl.transfer.heartbeat import read_heartbeats
from omnirl.transfer.keys import STOPPED_RUN, kv_key

RUN_OWNER = "run_owner"
LOCAL = "omnirl run"
RLJOB = "RLJob"
OWNER_TTL_S = 120
"""Seconds an RLJob's record lives unless its operator renews it (every reconcile: every 15 s by default)."""
LIVE_BEAT_S = 30.0
"""A role's heartbeat younger than this, with no `stop` flag set, means its job runs now: roles beat
about once a second while they work, and the launcher sets `stop` when it ends."""


def local_owner(out: str) -> dict[str, Any]:
    """The record of an `omnirl run` on this host writing to `out` (its --out), this process."""
    return {"kind": LOCAL, "host": socket.gethostname(), "out": str(out), "pid": os.getpid(), "time": time.time()}


def rljob_owner(namespace: str, name: str, uid: str) -> dict[str, Any]:
    """The record of RLJob `namespace/name` with `metadata.uid` `uid`."""
    return {"kind": RLJOB, "namespace": namespace, "name": name, "uid": uid, "time": time.time()}


def read_owner(client: redis.Redis, job: str) -> dict[str, Any] | None:
    """The job's run-owner record, or None when there is none.

    Raises:
        redis.RedisError: Redis unreachable or refusing.
        ValueError: the record is not a JSON object with a known ``kind`` (written by something else).
    """
    raw = client.get(kv_key(job, RUN_OWNER))
    if raw is None:
        return None
    doc = json.loads(raw)
    if not isinstance(doc, dict) or doc.get("kind") not in (LOCAL, RLJOB):
        raise ValueError(f"{kv_key(job, RUN_OWNER)} holds {raw!r}, not a run-owner record; delete that key")
    return doc


def write_owner(client: redis.Redis, job: str, owner: dict[str, Any], ttl_s: int | None = None) -> None:
    """Set the job's run-owner record (`ttl_s` seconds of life; None: until the job's keys are deleted).

    Raises:
        redis.RedisError: Redis unreachable or refusing.
    """
    client.set(kv_key(job, RUN_OWNER), json.dumps(owner).encode(), ex=ttl_s)


def describe(owner: dict[str, Any]) -> str:
    """One phrase naming where the run of `owner` runs (host and --out, or the RLJob and its uid)."""
    if owner["kind"] == RLJOB:
        return f"RLJob {owner.get('namespace')}/{owner.get('name')} (uid {owner.get('uid')})"
    return f"an omnirl run on host {owner.get('host')} (--out {owner.get('out')}, pid {owner.get('pid')})"


def live_beats(client: redis.Redis, job: str, now: float | None = None) -> list[tuple[float, str]]:
    """``(age in s, worker)`` of each heartbeat younger than `LIVE_BEAT_S`, youngest first; none when the
    job's ``stop`` flag is set (a run that ended sets it; its last beats stay young for a while).

    Raises:
        redis.RedisError: Redis unreachable or refusing.
    """
    if client.get(kv_key(job, "stop")) is not None:
        return []
    now = time.time() if now is None else now
    return sorted((max(now - float(b.get("t", 0)), 0.0), w) for w, b in read_heartbeats(client, job).items()
                  if now - float(b.get("t", 0)) < LIVE_BEAT_S)


def beats_text(beats: list[tuple[float, str]]) -> str:
    """``actor-0 1 s ago, rollout-0 2 s ago`` from `live_beats`."""
    return ", ".join(f"{worker} {age:.0f} s ago" for age, worker in beats)


def claim_for_rljob(client: redis.Redis, job: str, namespace: str, uid: str, started: bool) -> str | None:
    """Claim `job`'s keys for RLJob `namespace/job` (`uid`) before its children are created, and renew the
    claim on every later reconcile; or say who else holds them.

    Args:
        started: the RLJob already has children of its own (it ran before this operator, or before the
            run-owner record existed): live heartbeats without a record are then its own pods'.

    Returns:
        None once the record names this RLJob (renewed for `OWNER_TTL_S`); else one sentence naming the
        other run and where it runs (the record is left as it is).
    Raises:
        redis.RedisError: Redis unreachable or refusing.
        ValueError: the record is not a run-owner record.
    """
    owner = read_owner(client, job)
    if owner is not None and owner["kind"] == RLJOB and owner.get("uid") != uid:
        return (f"{describe(owner)} holds this name on that Redis (its operator renews the claim on every "
                f"reconcile; it lapses {OWNER_TTL_S} s after that RLJob stops running or is deleted)")
    if owner is None or owner["kind"] == LOCAL:
        beats = live_beats(client, job)
        if beats and (owner is not None or not started):
            who = describe(owner) if owner is not None else "a run that left no run-owner record (an older omnirl)"
            workers = ", ".join(sorted(w for _, w in beats))  # no ages: the status message stays as it is
            return f"{who} is running this job on that Redis (heartbeats of {workers} within {LIVE_BEAT_S:.0f} s)"
        stopped = client.get(kv_key(job, STOPPED_RUN))
        if stopped is not None and not beats:
            was = json.loads(stopped)
            return (f"an omnirl run stopped before it finished on host {was.get('host')} (--out {was.get('out')}) "
                    "left its pending work under this name on that Redis, which this job's pods would meet as "
                    f"their own; continue it there with omnirl run JOB --out {was.get('out')} --resume")
    write_owner(client, job, rljob_owner(namespace, job, uid), ttl_s=OWNER_TTL_S)
    return None
