"""The finalizer's work: delete every Redis key of one job (``omnirl:{job}:*``).

The deletion is ``omnirl.transfer.cleanup.delete_job_keys``'s, the one ``TransferQueue.cleanup()``
calls too (for a deleted RLJob, its keys' UNLINK runs in MULTI/EXEC under a WATCH of the job's run-owner
record, `cleanup_job`); that module is torch-free (the ``omnirl.transfer`` package loads its torch-dependent
parts lazily), and the operator must not import torch (import-linter contract; its image has none).
This module adds the operator's connection: a Secret's password, timeouts, redacted URLs in logs.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import redis

from omnirl.transfer.cleanup import delete_job_keys
from omnirl.transfer.keys import job_pattern, kv_key
from omnirl.transfer.owner import CLAIM_ATTEMPTS, NO_RECORD, RUN_OWNER, describe, is_rljob, parse_owner


def redacted(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for logs and events)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def cleanup_job(url: str, job: str, password: str | None = None, timeout_s: float = 10.0,
                uid: str | None = None, waiting: bool = False) -> int | str:
    """Connect to ``url`` (``redis://host:port/db``), delete ``job``'s keys, close; returns the count.

    Args:
        password: overrides a password in the URL (the Secret's ``password`` key).
        timeout_s: socket connect/read timeout, seconds.
        uid: the deleted RLJob's ``metadata.uid``: when the job's run-owner record
            (``omnirl.transfer.owner``) names another run — an ``omnirl run`` of that name, or an RLJob of
            another namespace or cluster, which held this RLJob at ``RedisNameInUse`` — the keys are that
            run's and nothing is deleted. The record is WATCHed from its read to the deletion: a run that
            claims the name in between is decided on again, its keys kept. None: delete whatever the record says.
        waiting: the RLJob waits at ``RedisNameInUse`` (it never ran on this Redis): without any record the
            keys are then a run's that left none (an older omnirl's, whose roles beat), and are kept too.

    Returns:
        The count of keys deleted (its own record with them), or a phrase naming the run whose keys they
        are (nothing deleted).
    Raises:
        redis.RedisError: connection or command failure.
        ValueError: the run-owner key holds something else than a record.
    """
    kwargs = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s, "decode_responses": False}
    if password:
        kwargs["password"] = password
    client = redis.Redis.from_url(url, **kwargs)
    try:
        if uid is None:
            return delete_job_keys(client, job)
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
    finally:
        client.close()
