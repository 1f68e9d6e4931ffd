"""A spent token budget survives Redis restarting empty: two ``tokenpace serve`` replicas
on one real ``redis-server`` without persistence, in front of
``bench/fixed_rate_upstream.py`` (a stand-in for vLLM). A tenant refused for its budget
was accepted again, its count back at 0, once Redis restarted empty."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from tests.support.process import KEY, Process, gateway_process, upstream_process
from tests.support.redis_server import RedisServer

BUDGET = 300
PREFIX = "budget"


@pytest.fixture
def two_replicas() -> Iterator[tuple[RedisServer, list[Process]]]:
    server = RedisServer().start()
    up = upstream_process(rate=0.0).start()
    tenants = [{"name": "acme", "api_keys": [KEY], "token_budget": BUDGET}]
    store = {"redis_url": server.url, "key_prefix": PREFIX, "reconnect_interval_s": 0.1}
    gws = [
        gateway_process(up.url, log_level="INFO", tenants=tenants, store=store) for _ in range(2)
    ]
    try:
        for gw in gws:
            gw.start()
        yield server, gws
    finally:
        for gw in gws:
            gw.stop()
        up.stop()
        server.stop()


def ask(gw: Process, tokens: int) -> httpx.Response:
    body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": f"Bearer {KEY}"}
    return httpx.post(
        f"{gw.url}/v1/chat/completions",
        json={**body, "max_tokens": tokens},
        headers=headers,
        timeout=20,
    )


def used(server: RedisServer) -> float:
    r = redis.Redis.from_url(server.url)
    try:
        keys = r.keys("{" + PREFIX + "}:b:acme:*")
        return sum(float(r.get(k) or 0) for k in keys)
    finally:
        r.close()


def test_a_spent_budget_is_not_reset_when_redis_restarts_empty(two_replicas) -> None:
    server, gws = two_replicas
    assert ask(gws[0], 150).status_code == 200
    assert ask(gws[1], 150).status_code == 200
    deadline = time.monotonic() + 10
    while used(server) <= BUDGET and time.monotonic() < deadline:
        time.sleep(0.05)  # the output tokens are charged in batches
    spent = used(server)
    assert spent > BUDGET
    for gw in gws:
        r = ask(gw, 5)
        assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota"
    time.sleep(0.5)  # a few checks of the store by each replica (every 0.1 s here)
    server.restart()  # empty: no persistence
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(
        "Redis lost its data" in gw.output() for gw in gws
    ):
        time.sleep(0.1)
    for _ in range(3):
        for gw in gws:
            r = ask(gw, 5)
            assert r.status_code == 429, r.text
            assert r.json()["error"]["code"] == "insufficient_quota"
    assert used(server) >= spent
    assert all("restored" in gw.output() and "token budget" in gw.output() for gw in gws)
