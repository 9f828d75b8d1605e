"""The finalizer's work: delete every Redis key of one job (``omnirl:{job}:*``).

The deletion is ``omnirl.transfer.cleanup.delete_job_keys``, the one ``TransferQueue.cleanup()``
calls too; that module is torch-free (the ``omnirl.transfer`` package loads its torch-dependent
parts lazily), and the operator must not import torch (import-linter contract; its image has none).
This module adds the operator's connection: a Secret's password, timeouts, redacted URLs in logs.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import redis

from omnirl.transfer.cleanup import delete_job_keys
from omnirl.transfer.owner import RLJOB, read_owner


def redacted(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for logs and events)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def cleanup_job(url: str, job: str, password: str | None = None, timeout_s: float = 10.0,
                uid: str | None = None) -> int | dict:
    """Connect to ``url`` (``redis://host:port/db``), delete ``job``'s keys, close; returns the count.

    Args:
        password: overrides a password in the URL (the Secret's ``password`` key).
        timeout_s: socket connect/read timeout, seconds.
        uid: the deleted RLJob's ``metadata.uid``: when the job's run-owner record
            (``omnirl.transfer.owner``) names another run — an ``omnirl run`` of that name, or an RLJob of
            another namespace or cluster, which held this RLJob at ``RedisNameInUse`` — the keys are that
            run's and nothing is deleted. None: delete whatever the record says.

    Returns:
        The count of keys deleted, or the other run's record (nothing deleted).
    Raises:
        redis.RedisError: connection or command failure.
        ValueError: the run-owner key holds something else than a record.
    """
    kwargs = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s, "decode_responses": False}
    if password:
        kwargs["password"] = password
    client = redis.Redis.from_url(url, **kwargs)
    try:
        if uid is not None:
            owner = read_owner(client, job)
            if owner is not None and not (owner["kind"] == RLJOB and owner.get("uid") == uid):
                return owner
        return delete_job_keys(client, job)
    finally:
        client.close()
