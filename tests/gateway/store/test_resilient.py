"""Redis unreachable at start-up or killed mid-run: the gateway keeps serving (fail open)
or refuses with 503 (fail closed), reconnects by itself and reconciles."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from gateway.config.schema import hash_key
from tests.support.cluster import Log, capped_upstream, chat, cluster_config, replicas, stream_once
from tests.support.ports import free_port
from tests.support.redis_server import RedisServer
from tests.support.waiting import eventually

KEY = "key-acme-00000000"
TENANTS = [{"name": "acme", "api_keys": [KEY]}]


def report(rid: str) -> dict:
    return {
        "request_id": rid,
        "expected": {"ttft": 1.0, "tds": 4.8},
        "arrivals": [[0.5, 3]],
        "outcome": "completed",
    }


def fast_store(url: str, prefix: str, **extra) -> dict:
    return {
        "redis_url": url,
        "key_prefix": prefix,
        "timeout_s": 0.3,
        "reconnect_interval_s": 0.1,
        **extra,
    }


async def test_unreachable_at_start_fail_open_then_reconnects(key_prefix) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    async with capped_upstream(n_tokens=3, token_interval=0.001) as up:
        store = fast_store(url, key_prefix, key_cache_s=0)
        config = cluster_config(up.url, TENANTS, redis_url=url, prefix=key_prefix, store=store)
        async with replicas(config, 1) as (gw,), gw.client(KEY) as c:
            assert not gw.state.store.up
            start = time.monotonic()
            r = await c.post("/v1/chat/completions", json=chat())
            assert r.status_code == 200 and time.monotonic() - start < 1.0
            rid = r.headers["x-request-id"]
            tel = await c.post("/v1/tokenpace/telemetry", json=report(rid))
            assert tel.status_code == 202  # buffered while Redis is away
            assert tel.json()["stored"] is False
            server = RedisServer(port).start()
            try:
                assert await eventually(lambda: gw.state.store.up, timeout=5.0)
                redis = aioredis.from_url(url)
                p = f"{{{key_prefix}}}:"
                assert float(await redis.hget(p + "vtc", "acme")) > 0  # reconciled
                assert await redis.hget(p + f"req:{rid}", "tenant") == b"acme"
                entries = await redis.xrange(p + "tel")
                assert [e[1][b"rid"] for e in entries] == [rid.encode()]
                assert await redis.hget(p + "keys", hash_key(KEY)) == b"acme"  # seeded late
                assert (await c.post("/v1/chat/completions", json=chat())).status_code == 200
                await redis.aclose()
            finally:
                server.stop()


async def test_fail_closed_answers_503(key_prefix) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    async with capped_upstream() as up:
        store = fast_store(url, key_prefix, fail_mode="closed")
        config = cluster_config(up.url, TENANTS, redis_url=url, prefix=key_prefix, store=store)
        async with replicas(config, 1) as (gw,), gw.client(KEY) as c:
            r = await c.post("/v1/chat/completions", json=chat())
            assert r.status_code == 503
            assert r.json()["error"]["code"] == "store_unavailable"
            assert r.headers["retry-after"] == "1"
            assert (await c.get("/healthz")).status_code == 200


async def test_redis_killed_and_restarted_mid_run(key_prefix) -> None:
    server = RedisServer(persist=True).start()
    try:
        async with capped_upstream(n_tokens=8, token_interval=0.01) as up:
            store = fast_store(server.url, key_prefix)
            config = cluster_config(
                up.url,
                TENANTS,
                redis_url=server.url,
                prefix=key_prefix,
                max_concurrent=2,
                store=store,
            )
            async with replicas(config) as gws:
                log = Log()
                clients = [gws[i % 2].client(KEY) for i in range(4)]
                redis = aioredis.from_url(server.url)
                p = f"{{{key_prefix}}}:"
                end = time.monotonic() + 3.0

                async def load(c) -> None:
                    while time.monotonic() < end:
                        await stream_once(c, "acme", log)

                async def chaos() -> tuple[float, str]:
                    await asyncio.sleep(0.8)
                    before = float(await redis.hget(p + "vtc", "acme"))
                    server.kill()
                    await asyncio.sleep(0.3)
                    r = await clients[0].post("/v1/chat/completions", json=chat())
                    assert r.status_code == 200
                    rid = r.headers["x-request-id"]
                    tel = await clients[0].post("/v1/tokenpace/telemetry", json=report(rid))
                    assert tel.status_code == 202
                    await asyncio.sleep(0.5)
                    server.start()  # same port, same data directory
                    return before, rid

                (before, rid), *_ = await asyncio.gather(chaos(), *(load(c) for c in clients))
                assert all(gw.state.store.up for gw in gws)
                assert log.statuses and set(log.statuses) == {200}  # nothing failed or hung
                assert len(log.ttfts["acme"]) > 20
                # counters carried on from where they were, the outage's service included
                await redis.aclose()
                redis = aioredis.from_url(server.url)
                after = float(await redis.hget(p + "vtc", "acme"))
                assert after > before
                entries = await redis.xrange(p + "tel")
                assert rid.encode() in [e[1][b"rid"] for e in entries if e[1][b"side"] == b"client"]
                for c in clients:
                    await c.aclose()
                await redis.aclose()
    finally:
        server.stop()


async def test_a_report_accepted_during_an_outage_is_stored_after_redis_restarts_empty(
    key_prefix,
) -> None:
    """A request admitted before the outage, reported during it: the report is answered
    202 (buffered) and stored once Redis is back, although Redis came back without the
    request (it was silently dropped as unknown)."""
    server = RedisServer().start()  # no persistence: a restart loses everything
    try:
        async with capped_upstream(n_tokens=3, token_interval=0.001) as up:
            store = fast_store(server.url, key_prefix)
            config = cluster_config(
                up.url, TENANTS, redis_url=server.url, prefix=key_prefix, store=store
            )
            async with replicas(config, 1) as (gw,), gw.client(KEY) as c:
                rids = []
                for _ in range(3):
                    r = await c.post("/v1/chat/completions", json=chat())
                    assert r.status_code == 200
                    rids.append(r.headers["x-request-id"])
                server.kill()
                answers = [
                    await c.post("/v1/tokenpace/telemetry", json=report(rid)) for rid in rids
                ]
                assert [a.status_code for a in answers] == [202] * 3
                again = await c.post("/v1/tokenpace/telemetry", json=report(rids[0]))
                assert again.status_code == 409  # the duplicate check still holds meanwhile
                server.start()  # empty
                assert await eventually(lambda: gw.state.store.up, timeout=5.0)
                redis = aioredis.from_url(server.url)
                p = f"{{{key_prefix}}}:"
                entries = await redis.xrange(p + "tel")
                stored = [e[1][b"rid"].decode() for e in entries if e[1][b"side"] == b"client"]
                assert sorted(stored) == sorted(rids)
                for rid in rids:  # and a second report is refused as a duplicate
                    r = await c.post("/v1/tokenpace/telemetry", json=report(rid))
                    assert r.status_code == 409
                await redis.aclose()
    finally:
        server.stop()
