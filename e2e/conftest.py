"""e2e tests use the same real redis-server fixtures as the unit tests."""

from tests.conftest import redis_client, redis_server, redis_url  # noqa: F401 - pytest fixtures
