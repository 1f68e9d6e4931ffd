"""Fixtures shared by the test modules: a real redis-server for the whole session."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.support.redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def key_prefix() -> str:
    """A key prefix of the test's own, so tests sharing the server never see each other."""
    return "tp-test-" + uuid.uuid4().hex[:12]
