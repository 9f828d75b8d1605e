"""The finalizer's work: delete every Redis key of one job (``omnirl:{job}:*``).

This mirrors ``omnirl.transfer.TransferQueue.cleanup()`` (SCAN MATCH + UNLINK in batches) without
importing ``omnirl.transfer``, whose package import pulls in torch (the codec), which the operator
must not load (import-linter contract; the operator image has no torch). A test runs both against
a real redis-server and checks they remove the same keys, so the two cannot drift apart.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

import redis

# The TransferQueue's key layout (omnirl.transfer.keys): every key of job J starts with "omnirl:J:".
KEY_PREFIX = "omnirl"
_JOB_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def job_key_pattern(job: str) -> str:
    """``omnirl:{job}:*``: matches every key of ``job`` and no other job's.

    Raises:
        ValueError: for a name that is not DNS-1123 (it could match other jobs' keys).
    """
    if not isinstance(job, str) or not _JOB_RE.match(job) or len(job) > 253:
        raise ValueError(f"invalid job name {job!r}: a Kubernetes object name (DNS-1123) is required")
    return f"{KEY_PREFIX}:{job}:*"


def delete_job_keys(client: redis.Redis, job: str, batch: int = 500) -> int:
    """UNLINK every key of ``job``; returns how many were removed (0 when none existed).

    Raises:
        redis.RedisError: when Redis is unreachable or refuses (the caller retries).
    """
    removed, pending = 0, []
    for key in client.scan_iter(match=job_key_pattern(job), count=1000):
        pending.append(key)
        if len(pending) >= batch:
            removed += int(client.unlink(*pending))
            pending = []
    if pending:
        removed += int(client.unlink(*pending))
    return removed


def redacted(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for logs and events)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def cleanup_job(url: str, job: str, password: str | None = None, timeout_s: float = 10.0) -> int:
    """Connect to ``url`` (``redis://host:port/db``), delete ``job``'s keys, close; returns the count.

    Args:
        password: overrides a password in the URL (the Secret's ``password`` key).
        timeout_s: socket connect/read timeout, seconds.

    Raises:
        redis.RedisError: connection or command failure.
    """
    kwargs = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s, "decode_responses": False}
    if password:
        kwargs["password"] = password
    client = redis.Redis.from_url(url, **kwargs)
    try:
        return delete_job_keys(client, job)
    finally:
        client.close()
