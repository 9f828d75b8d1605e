"""Who runs a job on its Redis: the run-owner record, written by whoever started the run.

A job's keys are ``omnirl:{job}:*`` (`keys.py`), so two runs of one name on one Redis — an `omnirl run`
and an RLJob on a shared Redis, or RLJobs of one name in two namespaces or clusters — read and write the
same streams, and a fresh start deletes the other's keys. The heartbeats say that the job runs, not who
runs it: the operator could not tell its own RLJob's pods from a local run's roles. This record is the
one fact that says who: ``omnirl:{job}:kv:run_owner`` =

- ``{"kind": "omnirl run", "host", "out", "pid", "time", "lease_s"}``: claimed by the launcher before it
  touches the job's keys (`launch/preflight.py::claim_run`) with a TTL of `lease_s` (`LOCAL_LEASE_S`),
  which the launcher renews every `LOCAL_RENEW_S` while it runs: the run holds the name from its claim
  on, before any role beats (Ray start-up, judge servers, model loading). A run stopped before it
  finished rewrites it with ``"stopped"`` and no TTL (its pending work stays its own); a run that
  finished deletes it with the job's keys; both only while the record is still its own (`stop_local`).
  A record without ``lease_s`` was written by an older launcher: that run is live while its roles beat
  and no ``stop`` flag is set;
- ``{"kind": "RLJob", "namespace", "name", "uid", "time", "lease_s", "suspended"}``: claimed by the
  operator on every reconcile of an RLJob that runs or is suspended (a suspended RLJob keeps its name and
  its pending work), also one that refuses its edited spec (its pods go on), with a TTL of `lease_s`
  (`OWNER_TTL_S` unless the operator's settings say else: it lapses once no operator reconciles that
  RLJob); released when the RLJob finishes and deleted with the
  job's keys when it is deleted.

Every claim is atomic (`claim`: WATCH on the record, the decision, then MULTI/SET/EXEC, retried when the
record changed in between): of two claimants in the same instant exactly one wins, and the other reads
the winner's record. Before, each read the record, found none, and wrote its own: both ran.

Plain redis-py and json, no torch: the operator imports it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import redis

from omnirl.transfer.heartbeat import read_heartbeats
from omnirl.transfer.keys import job_pattern, kv_key
from omnirl.transfer.records import STOP, STOPPED_RUN, JobRecords

RUN_OWNER = "run_owner"
LOCAL = "omnirl run"
RLJOB = "RLJob"
OWNER_TTL_S = 120
"""Seconds an RLJob's record lives unless its operator renews it (every reconcile: every 15 s by default);
the operator's `OMNIRL_RUN_OWNER_TTL_SECONDS` overrides it."""
LOCAL_LEASE_S = 30
"""Seconds an `omnirl run`'s record lives unless its launcher renews it (every `LOCAL_RENEW_S`): a launcher
killed with SIGKILL holds the name this long at most."""
LOCAL_RENEW_S = 5.0
LIVE_BEAT_S = 30.0
"""A role's heartbeat younger than this, with no `stop` flag set, means its job runs now: roles beat
about once a second while they work, and the launcher sets `stop` when it ends."""
CLAIM_ATTEMPTS = 50
"""WATCH rounds before `claim` gives up: each lost round means another claimant wrote the record, which the
next round reads; losing 50 in a row means the record is rewritten in a loop by something else."""


def local_owner(out: str, lease_s: float = LOCAL_LEASE_S) -> dict[str, Any]:
    """The record of an `omnirl run` on this host writing to `out` (its --out), this process; its key lives
    `lease_s` seconds unless renewed (`renew_local`)."""
    return {"kind": LOCAL, "host": socket.gethostname(), "out": str(out), "pid": os.getpid(), "time": time.time(),
            "lease_s": lease_s}


def rljob_owner(namespace: str, name: str, uid: str, lease_s: float = OWNER_TTL_S,
                suspended: bool = False) -> dict[str, Any]:
    """The record of RLJob `namespace/name` with `metadata.uid` `uid` (`suspended`: `spec.suspend` is true)."""
    return {"kind": RLJOB, "namespace": namespace, "name": name, "uid": uid, "time": time.time(),
            "lease_s": lease_s, "suspended": suspended}


def parse_owner(job: str, raw: bytes | None) -> dict[str, Any] | None:
    """The record `raw` (the value of the job's run-owner key; None: no key) as a dict, or None.

    Raises:
        ValueError: not a JSON object with a known ``kind``, naming the key and the fix.
    """
    if raw is None:
        return None
    doc = json.loads(raw)
    if not isinstance(doc, dict) or doc.get("kind") not in (LOCAL, RLJOB):
        raise ValueError(f"{kv_key(job, RUN_OWNER)} holds {raw!r}, not a run-owner record; delete that key")
    return doc


def read_owner(client: redis.Redis, job: str) -> dict[str, Any] | None:
    """The job's run-owner record, or None when there is none.

    Raises:
        redis.RedisError: Redis unreachable or refusing.
        ValueError: the record is not a JSON object with a known ``kind`` (written by something else).
    """
    return parse_owner(job, client.get(kv_key(job, RUN_OWNER)))


def write_owner(client: redis.Redis, job: str, owner: dict[str, Any], ttl_s: float | None = None) -> None:
    """Set the job's run-owner record unconditionally (`ttl_s` seconds of life; None: until the job's keys
    are deleted). Claims go through `claim`, which is atomic; this is for tests and hand repairs.

    Raises:
        redis.RedisError: Redis unreachable or refusing.
    """
    client.set(kv_key(job, RUN_OWNER), json.dumps(owner).encode(), px=None if ttl_s is None else int(ttl_s * 1000))


def claim(client: redis.Redis, job: str, record: dict[str, Any],
          refusal: Callable[[dict[str, Any] | None], str | None], ttl_s: float | None) -> str | None:
    """Atomically set the job's record to `record` unless `refusal` objects to the record there now.

    The record key is WATCHed while `refusal(current record or None)` decides (it may read other keys:
    heartbeats, flags); the SET runs in MULTI/EXEC, which Redis aborts when the record changed since the
    WATCH, and the decision is then taken again on the new record. So of two claimants in one instant
    exactly one writes, and the other decides on the winner's record.

    Args:
        record: the claimant's record (`local_owner`, `rljob_owner`).
        refusal: why the claimant may not take the name from the record there (None: it may).
        ttl_s: seconds the record lives (None: no TTL).

    Returns:
        None once `record` is written; else `refusal`'s sentence (nothing written).
    Raises:
        redis.RedisError: Redis unreachable or refusing, or the record kept changing for `CLAIM_ATTEMPTS` rounds.
        ValueError: the record is not a run-owner record.
    """
    key = kv_key(job, RUN_OWNER)
    with client.pipeline() as pipe:
        for _ in range(CLAIM_ATTEMPTS):
            try:
                pipe.watch(key)
                why = refusal(parse_owner(job, pipe.get(key)))
                if why is not None:
                    pipe.unwatch()
                    return why
                pipe.multi()
                pipe.set(key, json.dumps(record).encode(), px=None if ttl_s is None else int(ttl_s * 1000))
                pipe.execute()
                return None
            except redis.WatchError:
                continue  # another claimant wrote the record between our read and our write: decide again
    raise redis.RedisError(f"{key} changed on every one of {CLAIM_ATTEMPTS} claim attempts; something rewrites "
                           "it in a loop: find that client (redis-cli MONITOR)")


def _if_mine(client: redis.Redis, job: str, mine: Callable[[dict[str, Any]], bool],
             then: Callable[[Any, bytes], None]) -> bool:
    """Run `then(pipeline, raw record)` in MULTI/EXEC when the record there is `mine` (WATCHed: a record
    rewritten in between by another run is decided on again). Returns whether it ran."""
    key = kv_key(job, RUN_OWNER)
    with client.pipeline() as pipe:
        for _ in range(CLAIM_ATTEMPTS):
            try:
                pipe.watch(key)
                raw = pipe.get(key)
                owner = parse_owner(job, raw)
                if owner is None or not mine(owner):
                    pipe.unwatch()
                    return False
                pipe.multi()
                then(pipe, raw)
                pipe.execute()
                return True
            except redis.WatchError:
                continue
    raise redis.RedisError(f"{key} changed on every one of {CLAIM_ATTEMPTS} attempts; something rewrites it in a "
                           "loop: find that client (redis-cli MONITOR)")


def is_rljob(uid: str) -> Callable[[dict[str, Any]], bool]:
    """`mine` for `release`: the record of RLJob `uid`."""
    return lambda owner: owner["kind"] == RLJOB and owner.get("uid") == uid


def is_local(out: str, host: str | None = None) -> Callable[[dict[str, Any]], bool]:
    """`mine` for `release`/`renew_local`/`stop_local`: the record of the `omnirl run` of --out
    `out` on `host` (default this host); the run directory's lock makes that one launcher."""
    host = socket.gethostname() if host is None else host
    return lambda owner: owner["kind"] == LOCAL and (owner.get("host"), owner.get("out")) == (host, str(out))


def release(client: redis.Redis, job: str, mine: Callable[[dict[str, Any]], bool]) -> bool:
    """Delete the job's record when it is `mine` (`is_rljob`, `is_local`); another run's stays.

    Returns:
        Whether a record was deleted.
    Raises:
        redis.RedisError: Redis unreachable or refusing.
        ValueError: the record is not a run-owner record.
    """
    return _if_mine(client, job, mine, lambda pipe, raw: pipe.delete(kv_key(job, RUN_OWNER)))


def renew_local(client: redis.Redis, job: str, out: str, lease_s: float = LOCAL_LEASE_S) -> bool:
    """Give this host's `omnirl run` of --out `out` its record's `lease_s` seconds again.

    Returns:
        False when the record is gone or names another run (a lapsed lease taken over, a hand deletion).
    Raises:
        redis.RedisError: Redis unreachable or refusing.
    """
    key = kv_key(job, RUN_OWNER)
    return _if_mine(client, job, is_local(out), lambda pipe, raw: pipe.pexpire(key, int(lease_s * 1000)))


def stop_local(client: redis.Redis, job: str, out: str, finished: bool,
               place: dict[str, Any]) -> tuple[dict[str, Any] | None, int]:
    """What this host's `omnirl run` of --out `out` leaves on its Redis once its roles are stopped, atomically,
    and only while the record is its own (or gone): `finished`, every key of the job is deleted, the record
    with them (they hold no pending work); else the ``stop`` flag and `place` (`STOPPED_RUN`: host, out, time)
    are set and the record is rewritten as stopped, without a TTL: its pending work stays its own (an RLJob's
    finalizer leaves those keys), and nothing renews it any more.

    The record is WATCHed from its read to the writes: a record that names another run (an RLJob or another
    launcher that took the name after this run's lease lapsed) leaves every key as it is. Before, the ``stop``
    flag ended that run's roles, or the deletion took its record and pending work.

    Returns:
        ``(None, keys deleted)`` once done (0 unless `finished`); else ``(the other run's record, 0)``, nothing
        written.
    Raises:
        redis.RedisError: Redis unreachable or refusing, or the record kept changing for `CLAIM_ATTEMPTS` rounds.
        ValueError: the record is not a run-owner record.
    """
    key = kv_key(job, RUN_OWNER)
    mine = is_local(out)
    with client.pipeline() as pipe:
        for _ in range(CLAIM_ATTEMPTS):
            try:
                pipe.watch(key)
                raw = pipe.get(key)
                owner = parse_owner(job, raw)
                if owner is not None and not mine(owner):
                    pipe.unwatch()
                    return owner, 0
                keys = list(pipe.scan_iter(match=job_pattern(job), count=1000)) if finished else []
                pipe.multi()
                if finished:
                    for start in range(0, len(keys), 500):
                        pipe.unlink(*keys[start:start + 500])
                else:
                    pipe.set(kv_key(job, STOP), b"true")
                    pipe.set(kv_key(job, STOPPED_RUN), json.dumps(place).encode())
                    if raw is not None:
                        pipe.set(key, json.dumps({**json.loads(raw), "stopped": time.time()}).encode())
                pipe.execute()
                return None, len(keys)
            except redis.WatchError:
                continue
    raise redis.RedisError(f"{key} changed on every one of {CLAIM_ATTEMPTS} attempts; something rewrites it in a "
                           "loop: find that client (redis-cli MONITOR)")


def leased(owner: dict[str, Any]) -> bool:
    """Whether `owner` is a claim that lives only while its holder renews it (not a stopped run's record,
    nor an older launcher's, which has no lease): its existence says that its run is live."""
    return bool(owner.get("lease_s")) and not owner.get("stopped")


def describe(owner: dict[str, Any]) -> str:
    """One phrase naming where the run of `owner` runs (host and --out, or the RLJob and its uid)."""
    if owner["kind"] == RLJOB:
        return f"RLJob {owner.get('namespace')}/{owner.get('name')} (uid {owner.get('uid')})"
    return f"an omnirl run on host {owner.get('host')} (--out {owner.get('out')}, pid {owner.get('pid')})"


NO_RECORD = ("a run that left no run-owner record (an omnirl older than that record, or a launcher killed "
             f"without stopping its roles, whose claim lapsed after {LOCAL_LEASE_S} s)")
"""Who a live job without a record is: its roles beat, but nothing claimed the name."""


def live_beats(client: redis.Redis, job: str, now: float | None = None) -> list[tuple[float, str]]:
    """``(age in s, worker)`` of each heartbeat younger than `LIVE_BEAT_S`, youngest first; none when the
    job's ``stop`` flag is set (a run that ended sets it; its last beats stay young for a while).

    Raises:
        redis.RedisError: Redis unreachable or refusing.
    """
    if JobRecords(client, job).stop_requested():
        return []
    now = time.time() if now is None else now
    return sorted((max(now - float(b.get("t", 0)), 0.0), w) for w, b in read_heartbeats(client, job).items()
                  if now - float(b.get("t", 0)) < LIVE_BEAT_S)


def beats_text(beats: list[tuple[float, str]]) -> str:
    """``actor-0 1 s ago, rollout-0 2 s ago`` from `live_beats`."""
    return ", ".join(f"{worker} {age:.0f} s ago" for age, worker in beats)


def claim_for_rljob(client: redis.Redis, job: str, namespace: str, uid: str, started: bool,
                    ttl_s: float = OWNER_TTL_S, suspended: bool = False) -> str | None:
    """Claim `job`'s keys for RLJob `namespace/job` (`uid`) before its children are created, and renew the
    claim on every later reconcile, suspended or not; or say who else holds them. Atomic (`claim`).

    Args:
        started: the RLJob already has children of its own (it ran before this operator, or before the
            run-owner record existed): live heartbeats without a record are then its own pods'.
        ttl_s: seconds the claim lives unless renewed (the operator's `run_owner_ttl_seconds`).
        suspended: `spec.suspend` is true (written into the record, for the message of a refused `omnirl run`).

    Returns:
        None once the record names this RLJob (renewed for `ttl_s`); else one sentence naming the
        other run and where it runs (the record is left as it is).
    Raises:
        redis.RedisError: Redis unreachable or refusing.
        ValueError: the record is not a run-owner record.
    """
    def refusal(owner: dict[str, Any] | None) -> str | None:
        if owner is not None and owner["kind"] == RLJOB and owner.get("uid") != uid:
            return (f"{describe(owner)} holds this name on that Redis (its operator renews the claim on every "
                    f"reconcile; it lapses {owner.get('lease_s', OWNER_TTL_S):g} s after that RLJob's last "
                    "reconcile, and is released when it finishes or is deleted)")
        if owner is None or owner["kind"] == LOCAL:
            beats = live_beats(client, job)
            workers = ", ".join(sorted(w for _, w in beats))  # no ages: the status message stays as it is
            if owner is not None and leased(owner):  # its launcher renews it: live before any role beats
                how = f"heartbeats of {workers} within {LIVE_BEAT_S:.0f} s" if beats else \
                    "starting: its launcher holds the claim, no role beats yet"
                return f"{describe(owner)} is running this job on that Redis ({how})"
            if beats and (owner is not None or not started):
                who = describe(owner) if owner is not None else NO_RECORD
                return f"{who} is running this job on that Redis (heartbeats of {workers} within {LIVE_BEAT_S:.0f} s)"
            was = JobRecords(client, job).stopped_run()
            if was is not None and not beats:
                return (f"an omnirl run stopped before it finished on host {was.get('host')} (--out {was.get('out')}) "
                        "left its pending work under this name on that Redis, which this job's pods would meet as "
                        f"their own; continue it there with omnirl run JOB --out {was.get('out')} --resume")
        return None

    return claim(client, job, rljob_owner(namespace, job, uid, ttl_s, suspended), refusal, ttl_s)


def delete_for_rljob(client: redis.Redis, job: str, uid: str, waiting: bool = False) -> int | str:
    """The operator's finalizer of RLJob `uid`: UNLINK every key of `job` unless they are another run's. When the
    run-owner record names another run — an ``omnirl run`` of that name, or an RLJob of another namespace or
    cluster, which held this RLJob at ``RedisNameInUse`` — nothing is deleted. The record is WATCHed from its read
    to the deletion (MULTI/EXEC): a run that claims the name in between is decided on again, its keys kept.

    Args:
        waiting: the RLJob waits at ``RedisNameInUse`` (it never ran on this Redis): without any record the keys
            are then a run's that left none (an older omnirl's, whose roles beat), and are kept too.
    Returns:
        The count of keys deleted (its own record with them), or a phrase naming the run whose keys they are.
    Raises:
        redis.RedisError: connection or command failure, or the record changed on every one of `CLAIM_ATTEMPTS`.
        ValueError: the run-owner key holds something else than a record.
    """
    key = kv_key(job, RUN_OWNER)
    with client.pipeline() as pipe:
        for _ in range(CLAIM_ATTEMPTS):
            try:
                pipe.watch(key)
                owner = parse_owner(job, pipe.get(key))
                if owner is not None and not is_rljob(uid)(owner):
                    return describe(owner)
                if owner is None and waiting:
                    return NO_RECORD
                keys = list(client.scan_iter(match=job_pattern(job), count=1000))
                pipe.multi()
                if keys:
                    pipe.unlink(*keys)
                pipe.execute()
                return len(keys)
            except redis.WatchError:
                continue  # a run claimed the name between the read and the deletion: decide again
    raise redis.RedisError(f"{key} changed on every one of {CLAIM_ATTEMPTS} attempts to delete the job's keys")
