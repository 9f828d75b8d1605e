"""e2e tests use the same real redis-server fixtures as the unit tests, plus a password-protected one."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
import redis
from tests.conftest import redis_client, redis_server, redis_url  # noqa: F401 - pytest fixtures

from omnirl.transfer.redis_server import start_redis_server


@pytest.fixture()
def protected_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A redis-server of its own that requires a password (as the chart's bundled Redis does).

    Yields:
        ``(url, password)``: ``redis://127.0.0.1:{port}/0`` without the password, and the password.
    """
    server = start_redis_server(dir=str(tmp_path_factory.mktemp("redis-auth")))
    password = f"e2e-{secrets.token_hex(8)}"
    client = redis.Redis.from_url(server.url)
    client.config_set("requirepass", password)
    client.close()
    try:
        yield server.url, password
    finally:
        server.stop()
