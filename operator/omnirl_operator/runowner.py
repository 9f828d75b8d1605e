"""Refuse an RLJob whose name is live on its Redis under another run (`omnirl.transfer.owner`).

A job's Redis keys are ``omnirl:{job}:*``: an RLJob started while an `omnirl run` of that name (or an
RLJob of that name in another namespace or cluster) runs on the same Redis would read and write that
run's streams and keys, and train on its samples. Each reconcile of a running or suspended RLJob, before
any child is created, claims the job's run-owner record for this RLJob (renewing it; atomically, so of
two claimants in one instant one wins) or, when another run holds the name, names that run; the
reconcile then creates nothing, and tries again on every resync, so the job starts once that run ended.
A suspended RLJob keeps its claim (its pending work waits in Redis for its resume); one that finishes
releases it at once (`release_redis_name`), and its finalizer deletes it with the job's keys. A Redis that cannot be read is not checked (the reconcile goes on, and says
so in the operator's log): a job whose Redis starts with it, as the chart's does, must not wait for it here;
its pods report an unreachable Redis themselves.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import urlsplit

import yaml
from pydantic import ValidationError

from omnirl.api.loader import job_from_dict
from omnirl.api.spec import RLJob
from omnirl.transfer.client import RedisError
from omnirl.transfer.owner import claim_for_rljob, is_rljob, release
from omnirl_operator.autoscale import _client, _password
from omnirl_operator.kube import KubeApi
from omnirl_operator.meta import child_name, owned_by
from omnirl_operator.pods import redis_url
from omnirl_operator.settings import OperatorSettings

REASON_REDIS_NAME_IN_USE = "RedisNameInUse"


def _where(job: RLJob, settings: OperatorSettings) -> tuple[str, str, str]:
    """``(url, the field that set it, host:port)`` of the job's Redis."""
    url = redis_url(job, settings)
    field = "spec.transferQueue.redisUrl" if job.spec.transferQueue.redisUrl else "OMNIRL_DEFAULT_REDIS_URL"
    parts = urlsplit(url)
    return url, field, f"{parts.hostname}:{parts.port or 6379}"


async def redis_name_conflict(kube: KubeApi, job: RLJob, ns: str, uid: str, stored: dict[str, Any],
                              settings: OperatorSettings, log: logging.Logger,
                              suspended: bool | None = None) -> str | None:
    """Claim the job's name on its Redis for RLJob `uid` (for `settings.run_owner_ttl_seconds`; marked
    suspended when `spec.suspend` is), or say why not.

    Args:
        stored: the job's children as read (``Kind/name`` → object or None); one owned by `uid` means the
            job ran before (heartbeats without a run-owner record are then its own pods').
        suspended: whether the record says suspended (None: `job.spec.suspend`).

    Returns:
        The status message naming the other run and the fix; None once claimed, or when the Redis could
        not be read (a warning in `log` says so).
    """
    url, field, where = _where(job, settings)
    started = any(obj is not None and owned_by(obj, uid) for obj in stored.values())
    name = job.metadata.name
    try:
        client = _client(url, await _password(kube, job, ns, settings))
        try:
            other = await asyncio.to_thread(claim_for_rljob, client, name, ns, uid, started,
                                            settings.run_owner_ttl_seconds,
                                            bool(job.spec.suspend) if suspended is None else suspended)
        finally:
            client.close()
    except (RedisError, ValueError) as exc:
        log.warning("job %s: its name on the Redis %s (%s) was not checked for another run: %s: %s",
                    name, where, field, type(exc).__name__, exc)
        return None
    if other is None:
        return None
    return (f"metadata.name: job {name!r} is in use on the Redis {where} ({field}): {other}. Its keys "
            f"(omnirl:{name}:*) would be shared, so nothing of this RLJob was created; it starts on its own once "
            "that run has ended (finished, or its keys deleted). To run both now, apply this RLJob under another metadata.name (or point it at "
            "another Redis)")


LIVE_PHASES = ("Pending", "Running", "Suspended")


async def keep_name_on_refused_edit(kube: KubeApi, body: dict[str, Any], ns: str, uid: str,
                                    settings: OperatorSettings, log: logging.Logger) -> None:
    """Renew RLJob `uid`'s claim of its name when a reconcile refuses its edited spec (`InvalidSpec`): its
    pods go on with the spec it last applied, so its name stays held on *that* spec's Redis (the job's
    ConfigMap, ``job.yaml``; an edit of `spec.transferQueue.redisUrl` is not applied either), as suspended
    when its status is. Before, such a reconcile returned before the claim, which lapsed after
    `run_owner_ttl_seconds`, and an `omnirl run` of that name could then take it while the RLJob's pods ran.

    Nothing is renewed for a job that never applied a spec (no ConfigMap of its own) or has finished. Another
    run holding the name is logged as a warning, nothing else changed (the refused edit is what the status says).

    Raises:
        KubeError: the ConfigMap could not be read (kopf retries the handler).
    """
    status = body.get("status") or {}
    if status.get("phase") not in LIVE_PHASES or status.get("observedGeneration") is None:
        return
    name = body["metadata"]["name"]
    spec_map = await asyncio.to_thread(kube.get, "v1", "ConfigMap", ns, child_name(name, suffix="spec"))
    text = ((spec_map or {}).get("data") or {}).get("job.yaml")
    if spec_map is None or not owned_by(spec_map, uid) or not text:
        return
    try:
        applied = job_from_dict(yaml.safe_load(text))
    except (ValidationError, ValueError, yaml.YAMLError) as exc:  # written by this operator: should not happen
        log.warning("job %s: its edit was refused and its applied spec (ConfigMap %s) does not load (%s: %s); its "
                    "claim of its name on its Redis was not renewed", name, child_name(name, suffix="spec"),
                    type(exc).__name__, exc)
        return
    other = await redis_name_conflict(kube, applied, ns, uid, {f"ConfigMap/{child_name(name, suffix='spec')}": spec_map},
                                      settings, log, suspended=status.get("phase") == "Suspended")
    if other is not None:
        log.warning("job %s: its edit was refused (InvalidSpec), and its name is not held by it: %s", name, other)


async def release_redis_name(kube: KubeApi, job: RLJob, ns: str, uid: str, settings: OperatorSettings,
                             log: logging.Logger) -> None:
    """Release RLJob `uid`'s claim of its name on its Redis, now that it finished (Succeeded or Failed):
    an `omnirl run` of that name may start there at once, not `run_owner_ttl_seconds` later. Only a record
    naming this RLJob is deleted (atomically: `owner.release`); the job's other keys stay until its
    finalizer. A Redis that cannot be reached is logged: the claim then lapses by itself."""
    url, field, where = _where(job, settings)
    try:
        client = _client(url, await _password(kube, job, ns, settings))
        try:
            await asyncio.to_thread(release, client, job.metadata.name, is_rljob(uid))
        finally:
            client.close()
    except (RedisError, ValueError) as exc:
        log.warning("job %s finished, but its claim of its name on the Redis %s (%s) was not released: %s: %s; it "
                    "lapses %g s after the last reconcile", job.metadata.name, where, field, type(exc).__name__, exc,
                    settings.run_owner_ttl_seconds)
