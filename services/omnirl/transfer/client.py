"""The Redis client every role, the launcher and `omnirl role`'s start-up use: one that rides out a Redis
restart. Torch-free (`omnirl role` reads the job's `finish` record with it before torch is imported)."""

from __future__ import annotations

import time
from typing import Any

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

RECONNECT_S = 120.0  # how long every role's (and the launcher's) Redis calls retry a Redis that went away

# redis-py's errors, named here for the packages that must not import redis (only `transfer/` does: an
# import-linter contract): any failure, and those of a Redis that does not answer (after the client's retries)
RedisError = redis.RedisError
REDIS_AWAY = (redis.ConnectionError, redis.TimeoutError)
RedisClient = redis.Redis  # the client type, for annotations


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


def plain_client(url: str, **kwargs: Any) -> redis.Redis:
    """A client of ``url`` without `redis_client`'s reconnect retries (``redis.Redis.from_url(url, **kwargs)``): for a
    check that must fail fast (the launcher's pre-flight, the operator's reconciles) or a thread that only warns."""
    return redis.Redis.from_url(url, **kwargs)


def probe_client(url: str, timeout_s: float = 5.0) -> redis.Redis:
    """`plain_client` with ``timeout_s`` seconds to connect and to answer, no retries (a context manager)."""
    return plain_client(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)


def ping(client: redis.Redis) -> None:
    """PING through ``client``. Raises `RedisError` (or OSError) when Redis does not answer."""
    client.ping()


def check_answers(url: str, timeout_s: float = 5.0) -> None:
    """PING ``url`` once through a `probe_client`. Raises `RedisError`, OSError, or ValueError for a bad URL."""
    with probe_client(url, timeout_s) as client:
        client.ping()
