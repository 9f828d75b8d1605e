"""The finalizer's work: delete every Redis key of one job (``omnirl:{job}:*``).

The deletion is ``omnirl.transfer.cleanup.delete_job_keys``'s, the one ``TransferQueue.cleanup()``
calls too (for a deleted RLJob, its keys' UNLINK runs in MULTI/EXEC under a WATCH of the job's run-owner
record, ``omnirl.transfer.owner.delete_for_rljob``); those modules are torch-free (the ``omnirl.transfer`` package loads its torch-dependent
parts lazily), and the operator must not import torch (import-linter contract; its image has none).
This module adds the operator's connection: a Secret's password, timeouts, redacted URLs in logs.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from omnirl.transfer.cleanup import delete_job_keys
from omnirl.transfer.client import plain_client
from omnirl.transfer.owner import delete_for_rljob


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
        RedisError (``omnirl.transfer.client``): connection or command failure.
        ValueError: the run-owner key holds something else than a record.
    """
    kwargs = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s, "decode_responses": False}
    if password:
        kwargs["password"] = password
    client = plain_client(url, **kwargs)
    try:
        return delete_job_keys(client, job) if uid is None else delete_for_rljob(client, job, uid, waiting)
    finally:
        client.close()
