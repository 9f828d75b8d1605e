"""The Redis client every role, the launcher and `omnirl role`'s start-up use: one that rides out a Redis
restart. Torch-free (`omnirl role` reads the job's `finish` record with it before torch is imported)."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

RECONNECT_S = 120.0  # how long every role's (and the launcher's) Redis calls retry a Redis that went away


def redis_client(url: str, reconnect_s: float = RECONNECT_S, retries: int | None = None, **kwargs: Any) -> redis.Redis:
    """A bytes client for ``url`` that rides out a Redis restart (see :meth:`TransferQueue.from_url`); `kwargs`
    go to ``redis.Redis.from_url`` (e.g. ``socket_connect_timeout``, seconds). `retries` (default: as many as
    fill about `reconnect_s` seconds against a refused port) sets the tries after the first instead: against a
    server that accepts and does not answer each try costs its whole ``socket_timeout``."""
    if retries is None:
        retries = max(1, int(reconnect_s) + 6)  # 50 ms … 2 s jittered (≈ 1 s each): ~6 quick tries, then ~1 s each
    # the builtin ConnectionError (refused, reset) too: redis-py retries a failed connect with these
    errors = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, ConnectionError, TimeoutError)
    retry = Retry(ExponentialWithJitterBackoff(base=0.05, cap=2.0), retries, supported_errors=errors)
    return redis.Redis.from_url(url, decode_responses=False, retry=retry, retry_on_error=list(errors), **kwargs)
