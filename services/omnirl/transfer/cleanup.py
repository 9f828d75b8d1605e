"""Delete every Redis key of one job (``omnirl:{job}:*``): the one cleanup of a job's TransferQueue.

Torch-free on purpose: :meth:`TransferQueue.cleanup <omnirl.transfer.queue.TransferQueue.cleanup>`
(the launcher's fresh start) and the operator's finalizer (whose image has no torch) both call
:func:`delete_job_keys`.
"""

from __future__ import annotations

import redis

from omnirl.transfer.keys import job_pattern, kv_key


def delete_job_keys(client: redis.Redis, job: str, batch: int = 500, keep: tuple[str, ...] = ()) -> int:
    """UNLINK every key of ``job`` (``SCAN MATCH omnirl:{job}:*``, ``batch`` keys per UNLINK).

    Streams, tensor and image keys, markers and KV values all go, but the kv names in ``keep``
    (``kv_key(job, name)``); other jobs' keys stay.

    Returns:
        How many keys were removed (0 when none existed).

    Raises:
        ValueError: for a name that is not DNS-1123 (its pattern could match other jobs' keys).
        redis.RedisError: when Redis is unreachable or refuses (the caller retries).
    """
    removed, pending = 0, []
    kept = {kv_key(job, name).encode() for name in keep}
    for key in client.scan_iter(match=job_pattern(job), count=1000):
        if (key.encode() if isinstance(key, str) else key) in kept:
            continue
        pending.append(key)
        if len(pending) >= batch:
            removed += int(client.unlink(*pending))
            pending = []
    if pending:
        removed += int(client.unlink(*pending))
    return removed
