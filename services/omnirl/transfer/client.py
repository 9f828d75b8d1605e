"""The Redis client every role, the launcher and `omnirl role`'s start-up use: one that rides out a Redis
restart. Torch-free (`omnirl role` reads the job's `finish` record with it before torch is imported)."""

from __future__ import annotations

import time
from typing import Any

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

RECONNECT_S = 120.0  # how long every role's (and the launcher's) Redis calls retry a Redis that went away


class _BoundedRetry(Retry):
    """redis-py's `Retry`, also bounded in time: `seconds` after a call's first try no failure is retried.

    redis-py hands the client's retry to its connections too, and a command that fails on a connection that
    broke under it (a blocking XREADGROUP when Redis went away) retries the reconnect inside each of its own
    retries: counted alone they multiplied, a role's call retried for ~2 h instead of 120 s (the actor and the
    controller were still retrying when `omnirl run` stopped the job 150 s after Redis died). With a deadline
    per call the outer call gives up once the inner reconnect has spent its time."""

    def __init__(self, backoff: Any, retries: int, supported_errors: tuple, seconds: float) -> None:
        super().__init__(backoff, retries, supported_errors)
        self._seconds = seconds

    def call_with_retry(self, do: Any, fail: Any, is_retryable: Any = None, with_failure_count: bool = False) -> Any:
        deadline = time.monotonic() + self._seconds

        def fail_then_stop(error: Exception, *count: int) -> None:
            fail(error, *count)  # redis-py's cleanup (disconnect) first, as it would before a retry
            if time.monotonic() >= deadline:
                raise error

        return super().call_with_retry(do, fail_then_stop, is_retryable, with_failure_count)


def redis_client(url: str, reconnect_s: float = RECONNECT_S, retries: int | None = None, **kwargs: Any) -> redis.Redis:
    """A bytes client for ``url`` that rides out a Redis restart (see :meth:`TransferQueue.from_url`); `kwargs`
    go to ``redis.Redis.from_url`` (e.g. ``socket_connect_timeout``, seconds). A call's failures are retried until
    `reconnect_s` seconds after its first try (the last wait may overshoot by up to 2 s), also when the connection
    broke under a blocking call (`_BoundedRetry`); then redis-py's ``ConnectionError``/``TimeoutError`` is raised.
    `retries` sets a count of tries after the first instead, with no time bound: against a server that accepts
    and does not answer each try costs its whole ``socket_timeout``."""
    bounded = retries is None  # a count given (the launcher's probe) is the bound itself
    if bounded:
        # time alone: counted, the inner reconnect's early tries (50 ms …) spent its count in ~4 s of 6, and the
        # command around it retried again; the waits are min(2 s, U·50 ms·2^n), ~2 s once past the first tries
        retries = -1  # no count (redis-py: a negative count retries until `_BoundedRetry`'s deadline)
    # the builtin ConnectionError (refused, reset) too: redis-py retries a failed connect with these
    errors = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, ConnectionError, TimeoutError)
    backoff = ExponentialWithJitterBackoff(base=0.05, cap=2.0)
    retry = (_BoundedRetry(backoff, retries, errors, reconnect_s) if bounded
             else Retry(backoff, retries, supported_errors=errors))
    return redis.Redis.from_url(url, decode_responses=False, retry=retry, retry_on_error=list(errors), **kwargs)
