"""kopf handlers of the RLJob operator: wiring only; the work is in ``reconcile.py``.

Run it (the chart's operator container does this)::

    kopf run -m omnirl_operator.handlers --standalone --all-namespaces \\
        --liveness=http://0.0.0.0:8080/healthz
    kopf run -m omnirl_operator.handlers --standalone --namespace=team-a --namespace=team-b \\
        --liveness=http://0.0.0.0:8080/healthz

What is registered (:func:`register`):

- create / update / resume → one idempotent reconcile (``id="reconcile"``);
- a timer every ``OMNIRL_RESYNC_SECONDS`` (default 15 s): the same reconcile, level-triggered, so
  a deleted child, a finished or failed controller Job, or pods becoming ready are noticed without
  watching every child kind; it also deletes finished jobs after
  ``failurePolicy.ttlSecondsAfterFinished``;
- delete → the finalizer ``omnirl.dev/redis-cleanup`` removes the job's Redis keys (children are
  removed by garbage collection through their ownerReferences), unless the job's run-owner record
  names another run of its name (``runowner.py``: the job waited at ``RedisNameInUse``; the keys are that run's);
- startup → watch timeouts, kopf's state in annotations, the API client; a liveness probe.

Status is written once per reconcile, only when it changed, as one merge patch of the ``status``
subresource that leaves the controller's progress fields alone. It is written inside the
per-object lock rather than through kopf's ``patch`` (which kopf applies after the handler
returns, when a timer run may already have read the old status). An event is posted on every
phase transition, and on a spec change of a running job (``SpecChanged``).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from datetime import datetime, timedelta
from typing import Any

import kopf

from omnirl.api.errors import FieldProblem, format_value
from omnirl.api.spec import API_GROUP, API_VERSION
from omnirl.api.spec_queue import check_redis_url
from omnirl.api.status import TERMINAL_PHASES, utc_now
from omnirl.transfer.client import RedisError
from omnirl_operator.kube import KubeApi
from omnirl_operator.reconcile import reconcile
from omnirl_operator.redis_cleanup import cleanup_job, redacted
from omnirl_operator.runowner import REASON_REDIS_NAME_IN_USE
from omnirl_operator.settings import OperatorSettings
from omnirl_operator.status import status_differs, transition

PLURAL = "rljobs"
FINALIZER = f"{API_GROUP}/redis-cleanup"
SERVER_TIMEOUT_S = 300.0  # the API server closes each watch after this long; kopf reconnects
CLIENT_TIMEOUT_S = 330.0  # a watch silent this long is dead: drop and reconnect
CONNECT_TIMEOUT_S = 30.0


def configure_kopf(settings: kopf.OperatorSettings) -> None:
    """Watch timeouts, kopf's bookkeeping in ``omnirl.dev/*`` annotations, our finalizer name."""
    settings.watching.server_timeout = SERVER_TIMEOUT_S
    settings.watching.client_timeout = CLIENT_TIMEOUT_S
    settings.watching.connect_timeout = CONNECT_TIMEOUT_S
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = FINALIZER
    # A deleted RLJob waits for its timer to stop before kopf releases it: check every 2 s, not 60.
    settings.background.cancellation_polling = 2.0
    settings.posting.level = logging.WARNING  # kopf's own log lines become events only when bad
    settings.posting.reporting_component = "omnirl-operator"


async def on_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    """Configure kopf; create the API client and read the operator settings unless given in ``memo``."""
    configure_kopf(settings)
    if memo.get("settings") is None:
        memo["settings"] = OperatorSettings.from_env()
    if memo.get("kube") is None:
        memo["kube"] = await asyncio.to_thread(KubeApi.from_environment)
    # Handlers get a shallow copy of this memo per object: share state through mutable values.
    memo["locks"] = {}
    memo["stats"] = {"reconciles": 0}
    logger.info("omnirl operator ready: images %s, default Redis %s", memo["settings"].image_for("actor"),
                redacted(memo["settings"].default_redis_url or "(none)"))


async def _reconcile_once(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger) -> dict | None:
    """Fetch the RLJob fresh (kopf's cached body can lag behind status writes), reconcile it and
    write its status. Returns the new status, or None when the job is gone."""
    meta = body["metadata"]
    lock = memo["locks"].setdefault(meta["uid"], asyncio.Lock())
    async with lock:  # the timer and a change handler may fire together for one object
        fresh = await asyncio.to_thread(memo["kube"].get, f"{API_GROUP}/{API_VERSION}", "RLJob",
                                        meta["namespace"], meta["name"])
        gone = fresh is None or fresh["metadata"].get("uid") != meta["uid"]
        if gone or fresh["metadata"].get("deletionTimestamp"):
            return None
        outcome = await reconcile(fresh, memo["kube"], memo["settings"], utc_now(), logger)
        if status_differs(fresh, outcome.status):
            # Written here, inside the lock, not via kopf's `patch` (applied after the handler
            # returns): a timer run starting in between would otherwise read the old status.
            await asyncio.to_thread(memo["kube"].patch, f"{API_GROUP}/{API_VERSION}", "RLJob",
                                    meta["namespace"], meta["name"], {"status": outcome.status}, sub="status")
    memo["stats"]["reconciles"] += 1
    for action in outcome.actions:
        logger.info(action)
    for kind, reason, message in outcome.events:
        kopf.event(body, type=kind, reason=reason, message=message)
    change = transition(fresh, outcome.status)
    if change is not None:
        old, new = change
        kind = "Warning" if new == "Failed" else "Normal"
        kopf.event(body, type=kind, reason=new, message=f"{old or 'New'} -> {new}: {outcome.status['message']}")
    return outcome.status


async def on_change(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    """create / update / resume: reconcile (returns nothing, so kopf stores no result in status)."""
    await _reconcile_once(body, memo, logger)


async def on_timer(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, stopped: Any = None,
                   **_: Any) -> None:
    """Level-triggered safety net: reconcile, then delete a finished job whose TTL ran out."""
    if stopped:  # the object is being deleted or the operator is exiting
        return
    status = await _reconcile_once(body, memo, logger)
    if status is None:
        return
    ttl = ((body.get("spec") or {}).get("failurePolicy") or {}).get("ttlSecondsAfterFinished")
    done = status.get("completionTime")
    if ttl is None or status["phase"] not in TERMINAL_PHASES or not done:
        return

    if datetime.fromisoformat(done.replace("Z", "+00:00")) + timedelta(seconds=ttl) <= utc_now():
        meta = body["metadata"]
        logger.info("ttlSecondsAfterFinished=%s passed: deleting RLJob %s", ttl, meta["name"])
        await asyncio.to_thread(memo["kube"].delete, f"{API_GROUP}/{API_VERSION}", "RLJob",
                                meta["namespace"], meta["name"])


async def _redis_password(body: kopf.Body, memo: kopf.Memo) -> str | None:
    secret_name = ((body.get("spec") or {}).get("transferQueue") or {}).get("passwordSecret")
    if not secret_name:
        return memo["settings"].default_redis_password
    secret = await asyncio.to_thread(memo["kube"].get, "v1", "Secret", body["metadata"]["namespace"], secret_name)
    data = (secret or {}).get("data") or {}
    if "password" not in data:
        raise kopf.TemporaryError(
            f"spec.transferQueue.passwordSecret: Secret {secret_name!r} has no key 'password'", delay=30
        )
    return base64.b64decode(data["password"]).decode()


async def on_delete(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, retry: int, **_: Any) -> None:
    """Finalizer: delete the job's Redis keys. Retried while Redis is unreachable; after the last
    retry kopf releases the object anyway (the error stays in the log and the events). A URL that
    cannot be parsed is no reason to retry (it cannot get better): one Warning event names the field
    and the object is released at once."""
    name = body["metadata"]["name"]
    memo["locks"].pop(body["metadata"]["uid"], None)
    own = ((body.get("spec") or {}).get("transferQueue") or {}).get("redisUrl")
    url, field = (own, "spec.transferQueue.redisUrl") if own else (memo["settings"].default_redis_url,
                                                                    "OMNIRL_DEFAULT_REDIS_URL")
    if not url:
        kopf.warn(body, reason="RedisCleanupSkipped", message="no Redis URL in the spec or the operator settings")
        return
    try:
        check_redis_url(url)  # the spec's own check: redis-py's ValueError was retried 6 times, 50 s
    except FieldProblem as err:
        kopf.warn(body, reason="RedisCleanupSkipped",
                  message=f"{field}: {format_value(err.value)} is invalid: {err.requirement}; the job's Redis keys "
                  f"omnirl:{name}:* were not deleted (delete them by hand in that Redis)")
        return
    password = await _redis_password(body, memo)
    try:
        ready = next((c for c in (body.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), {})
        waiting = ready.get("reason") == REASON_REDIS_NAME_IN_USE  # it never ran there: the keys are another run's
        removed = await asyncio.to_thread(cleanup_job, url, name, password, uid=body["metadata"]["uid"],
                                          waiting=waiting)
    except (RedisError, ValueError) as exc:
        raise kopf.TemporaryError(f"cannot clean Redis {redacted(url)} (attempt {retry + 1}): {exc}",
                                  delay=10) from exc
    if isinstance(removed, str):  # the job never ran there (RedisNameInUse): the keys are the other run's
        kopf.warn(body, reason="RedisCleanupSkipped",
                  message=f"the Redis keys omnirl:{name}:* belong to {removed}, not this RLJob: left as they are")
        return
    logger.info("deleted %d Redis keys omnirl:%s:* from %s", removed, name, redacted(url))
    kopf.info(body, reason="RedisCleaned", message=f"deleted {removed} Redis keys of job {name}")


async def liveness(memo: kopf.Memo, **_: Any) -> dict[str, int]:
    """Reported on the liveness endpoint next to kopf's own checks."""
    return {"reconciles": int(memo["stats"]["reconciles"]) if "stats" in memo else 0}


def register(registry: kopf.OperatorRegistry, resync_seconds: float = 15.0) -> kopf.OperatorRegistry:
    """Register every handler on ``registry`` (the default one for ``kopf run``, a fresh one in tests).

    Args:
        resync_seconds: period of the level-triggered timer, seconds.
    """
    res = (API_GROUP, API_VERSION, PLURAL)
    kopf.on.startup(registry=registry)(on_startup)
    kopf.on.create(*res, registry=registry, id="reconcile")(on_change)
    kopf.on.update(*res, registry=registry, id="reconcile")(on_change)
    kopf.on.resume(*res, registry=registry, id="reconcile")(on_change)
    kopf.timer(*res, registry=registry, id="resync", interval=resync_seconds, initial_delay=resync_seconds,
               timeout=120)(on_timer)
    kopf.on.delete(*res, registry=registry, id="redis-cleanup", retries=6, backoff=10)(on_delete)
    kopf.on.probe(registry=registry, id="omnirl")(liveness)
    return registry


register(kopf.get_default_registry(), OperatorSettings.from_env().resync_seconds)
