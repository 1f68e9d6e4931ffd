"""API keys across restarts, with real redis-server processes: a revoked key never works
again and a key created through the admin API keeps working, whether Redis restarts
empty (replicas restore it from their mirror, detected by the store's epoch) or with its
data (AOF), and whether replicas restart; key administration fails closed meanwhile."""

from __future__ import annotations

import asyncio
import logging

from gateway.config.schema import hash_key
from tests.support.cluster import capped_upstream, cluster_config, replicas
from tests.support.redis_server import RedisServer
from tests.support.waiting import eventually

ADMIN = "admin-key-0000001"
KEY = "key-acme-00000000"
BASE = "/v1/tokenpace/admin/tenants"
TENANTS = [{"name": "acme", "api_keys": [KEY]}, {"name": "basic", "api_keys": ["b" * 12]}]


def config(up_url: str, server: RedisServer, prefix: str):
    store = {
        "redis_url": server.url,
        "key_prefix": prefix,
        "key_cache_s": 0,
        "timeout_s": 0.3,
        "reconnect_interval_s": 0.1,
    }
    return cluster_config(
        up_url, TENANTS, redis_url=server.url, prefix=prefix, admin={"key": ADMIN}, store=store
    )


async def status(gw, key: str) -> int:
    async with gw.client(key) as c:
        return (await c.get("/v1/models")).status_code


async def revoke_and_create(gw) -> str:
    """Revoke the configured key KEY and create a new key for basic; returns the new key."""
    async with gw.client(ADMIN) as admin:
        made = await admin.post(f"{BASE}/basic/keys")
        assert made.status_code == 201
        gone = await admin.delete(f"{BASE}/acme/keys/{hash_key(KEY)}")
        assert gone.status_code == 200
        return made.json()["key"]


async def test_redis_restarted_empty_keeps_revocations_and_admin_keys(key_prefix, caplog) -> None:
    server = RedisServer().start()  # no persistence: a restart loses everything
    try:
        async with capped_upstream() as up:
            cfg = config(up.url, server, key_prefix)
            with caplog.at_level(logging.ERROR, "tokenpace.gateway.store"):
                async with replicas(cfg) as gws:
                    assert "Redis persistence is OFF" in caplog.text  # said loudly at start
                    new_key = await revoke_and_create(gws[0])
                    server.restart()  # empty, at once: one replica may not know yet
                    for gw in gws:
                        assert await eventually(lambda gw=gw: gw.state.store.up, 5.0)
                    await asyncio.sleep(0.5)  # a few key checks (every 0.1 s here)
                    for _ in range(3):  # then, and from then on, on every replica
                        for gw in gws:
                            assert await status(gw, KEY) == 401
                            assert await status(gw, new_key) == 200
                    assert "Redis lost its data" in caplog.text
                    # a replica that starts now learns the same from the store
                    async with replicas(cfg, 1) as (fresh,):
                        assert await status(fresh, KEY) == 401
                        assert await status(fresh, new_key) == 200
                # and with every replica restarted, Redis still running
                async with replicas(cfg, 1) as (again,):
                    assert await status(again, KEY) == 401
                    assert await status(again, new_key) == 200
    finally:
        server.stop()


async def test_with_aof_keys_survive_redis_and_every_replica_restarting(key_prefix, caplog) -> None:
    server = RedisServer(persist=True).start()
    try:
        async with capped_upstream() as up:
            cfg = config(up.url, server, key_prefix)
            with caplog.at_level(logging.WARNING, "tokenpace.gateway.store"):
                async with replicas(cfg, 1) as (gw,):
                    new_key = await revoke_and_create(gw)
                assert "persistence" not in caplog.text
            server.restart()  # nobody running: only Redis's own file remembers
            async with replicas(cfg) as gws:
                for gw in gws:
                    assert await status(gw, KEY) == 401
                    assert await status(gw, new_key) == 200
    finally:
        server.stop()


async def test_key_administration_fails_closed_while_redis_is_away(key_prefix) -> None:
    server = RedisServer().start()
    try:
        async with capped_upstream() as up:
            cfg = config(up.url, server, key_prefix)
            async with replicas(cfg, 1) as (gw,), gw.client(ADMIN) as admin:
                server.kill()
                for call in (
                    admin.post(f"{BASE}/basic/keys"),
                    admin.delete(f"{BASE}/acme/keys/{hash_key(KEY)}"),
                    admin.get(BASE),
                ):
                    r = await call
                    assert r.status_code == 503, r.text
                    assert r.json()["error"]["code"] == "store_unavailable"
                assert not gw.state.store.keys_known or not gw.state.store.up
                server.start()
                assert await eventually(lambda: gw.state.store.up, 5.0)
                assert (await admin.post(f"{BASE}/basic/keys")).status_code == 201
    finally:
        server.stop()
