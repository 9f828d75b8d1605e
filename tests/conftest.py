"""Shared pytest fixtures: a real, throw-away redis-server (tier "service" of references/style.md).

- ``redis_server`` (session): a ``RedisServer`` started once per test session on a free port, in a
  temporary directory, with no persistence; stopped at the end.
- ``redis_url`` (session): its URL, ``redis://127.0.0.1:{port}/0``.
- ``redis_client`` (function): a ``redis.Redis`` (bytes responses) on a FLUSHALLed database.

Needs ``redis-server`` on PATH (``apt-get install redis-server``); a clear error says so otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from omnirl.transfer.redis_server import RedisServer, start_redis_server


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server for the whole session (its log lies in the session's tmp dir)."""
    server = start_redis_server(dir=str(tmp_path_factory.mktemp("redis")))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    """``redis://127.0.0.1:{port}/0`` of the session's redis-server."""
    return redis_server.url


@pytest.fixture()
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client (``decode_responses=False``) on an empty database; FLUSHALL before each test."""
    client = redis.Redis.from_url(redis_url, decode_responses=False)
    client.flushall()
    try:
        yield client
    finally:
        client.close()
