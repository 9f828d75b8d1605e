"""The finalizer's work: delete every Redis key of one job (``omnirl:{job}:*``).

The key layout comes from ``omnirl.transfer.keys`` (torch-free; the ``omnirl.transfer`` package
loads its torch-dependent parts lazily). The SCAN MATCH + UNLINK loop mirrors
``TransferQueue.cleanup()`` rather than calling it: ``omnirl.transfer.queue`` imports the codec,
which imports torch, and the operator must not (import-linter contract; its image has no torch).
A test runs both against a real redis-server and checks they remove the same keys.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import redis

from omnirl.transfer.keys import job_pattern


def delete_job_keys(client: redis.Redis, job: str, batch: int = 500) -> int:
    """UNLINK every key of ``job``; returns how many were removed (0 when none existed).

    Raises:
        ValueError: for a name that is not DNS-1123 (its pattern could match other jobs' keys).
        redis.RedisError: when Redis is unreachable or refuses (the caller retries).
    """
    removed, pending = 0, []
    for key in client.scan_iter(match=job_pattern(job), count=1000):
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
