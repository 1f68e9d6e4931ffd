"""Redis unreachable at start-up or killed mid-run: the gateway keeps serving (fail open)
or refuses with 503 (fail closed), reconnects by itself and reconciles."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis
from redis._parsers.base import BaseParser
from redis.exceptions import ResponseError

from gateway.config.schema import hash_key
from gateway.store import MemoryStore, RedisStore, ResilientStore, StoreBusy, StoreMonitor
from gateway.store.resilient import _reply_kind
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


class Recorder(StoreMonitor):
    """What the store told its monitor."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.peak_in_use = 0

    def pool(self, in_use: int, size: int) -> None:
        self.peak_in_use = max(self.peak_in_use, in_use)

    def waited(self) -> None:
        self.events.append("waited")

    def outage(self) -> None:
        self.events.append("outage")

    def error(self, kind: str) -> None:
        self.events.append(kind)


async def test_calls_wait_for_a_free_connection(redis_server, key_prefix) -> None:
    """More calls than connections: they wait their turn (never MaxConnectionsError)."""
    monitor = Recorder()
    store = RedisStore(redis_server.url, key_prefix, max_connections=2, monitor=monitor)
    try:
        answers = await asyncio.gather(*(store.hit("acme", "x", 1000) for _ in range(50)))
        assert all(ok for ok, _ in answers)
        assert "waited" in monitor.events and "busy" not in monitor.events
        assert monitor.peak_in_use == 2
    finally:
        await store.aclose()


async def test_a_busy_pool_or_a_slow_redis_is_not_an_outage(redis_server, key_prefix) -> None:
    """No connection free in time, or no answer in time while Redis answers a PING: that
    call is refused (StoreBusy, 503 store_busy), and the store stays on Redis."""
    monitor = Recorder()
    redis = RedisStore(
        redis_server.url, key_prefix, max_connections=1, timeout_s=0.2, monitor=monitor
    )
    store = ResilientStore(redis, MemoryStore(), fail_open=True, monitor=monitor)
    await store.start()
    try:
        await redis._gate.acquire()  # the one connection is someone else's, for long
        try:
            with pytest.raises(StoreBusy, match="no free Redis connection"):
                await store.hit("acme", "x", 10)
        finally:
            redis._gate.release()
        admin = aioredis.from_url(redis_server.url)
        await admin.client_pause(1000, all=False)  # write commands wait; PING does not
        try:
            with pytest.raises(StoreBusy, match="in time, but is up"):
                await store.hit("acme", "x", 10)
        finally:
            await admin.execute_command("CLIENT", "UNPAUSE")
            await admin.aclose()
        assert store.up and "outage" not in monitor.events
        assert monitor.events.count("busy") == 2
        assert (await store.hit("acme", "x", 10))[0]
    finally:
        await store.aclose()


def test_error_replies_that_mean_redis_cannot_serve_are_outages() -> None:
    for reply in ("LOADING Redis is loading", "READONLY You can't write", "OOM command not"):
        assert _reply_kind(ResponseError(reply)) == "down"
    assert _reply_kind(ResponseError("BUSY Redis is busy running a script")) == "busy"
    for reply in ("WRONGTYPE Operation", "ERR user_script:1: argument 4 is not a weight"):
        assert _reply_kind(ResponseError(reply)) == "command"
    # as redis-py raises them: the first word taken off the message, kept as status_code
    for reply in ("OOM command not allowed", "READONLY You can't write", "MASTERDOWN Link"):
        exc = BaseParser.parse_error(reply)
        assert isinstance(exc, ResponseError) and not str(exc).startswith(exc.status_code)
        assert _reply_kind(exc) == "down"
