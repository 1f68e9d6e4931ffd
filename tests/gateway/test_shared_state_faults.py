"""One tenant must not take the shared state down, and the gateway must keep Redis under
load: real processes (``tokenpace serve``, a real ``redis-server``,
``bench/fixed_rate_upstream.py`` standing in for vLLM).

- a telemetry report whose timeline gives no finite QoE is a 400 naming the field, and
  everyone else is served meanwhile (fail closed included), the admin API too;
- a command Redis refuses fails that call alone, and a poison record in the replay
  buffer never holds the reconnect back;
- a burst of streams waits for Redis connections instead of falling back to local state;
- a QoE summary costs the same Redis work at 10× the records;
- a telemetry token replayed never uses up its tenant's telemetry quota;
- bodies sent without a credential hold a bounded amount of memory, all connections
  together.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from gateway.store import QoERecord, RedisStore
from tests.support.process import KEY, Process, gateway_process, upstream_process
from tests.support.redis_server import RedisServer

ADMIN = "tp-fault-admin-key-0001"
KEY_GLOBEX = "tp-fault-key-globex-0002"
TENANTS = [{"name": "acme", "api_keys": [KEY]}, {"name": "globex", "api_keys": [KEY_GLOBEX]}]
PREFIX = "tp-faults"
P = "{" + PREFIX + "}:"  # the prefix of every key in Redis


def chat(tokens: int = 1, stream: bool = True) -> dict:
    body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return {**body, "max_tokens": tokens}


def report(rid: str, arrivals: list, **extra) -> dict:
    return {
        "request_id": rid,
        "expected": {"ttft": 1, "tds": 4.8},
        "arrivals": arrivals,
        "outcome": "completed",
        **extra,
    }


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def strict_json(text: str) -> object:
    """JSON without NaN or Infinity (Python's reader accepts them by default)."""

    def refuse(name: str) -> object:
        raise AssertionError(f"{name} in a JSON answer")

    return json.loads(text, parse_constant=refuse)


def metric(gw: Process, name: str, **labels: str) -> float:
    text = httpx.get(gw.url + "/metrics", timeout=10).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


@pytest.fixture
def redis_server_own() -> Iterator[RedisServer]:
    """A redis-server of the test's own (the session's is shared with other tests)."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def upstream() -> Iterator[Process]:
    up = upstream_process(rate=200.0).start()
    try:
        yield up
    finally:
        up.stop()


def serve(
    up: Process, redis: RedisServer, *, sections: dict | None = None, **store: object
) -> Process:
    """``tokenpace serve`` on ``redis``; ``sections`` replace whole sections of the file."""
    config = {
        "tenants": TENANTS,
        "admin": {"key": ADMIN},
        "store": {"redis_url": redis.url, "key_prefix": PREFIX, **store},
        **(sections or {}),
    }
    return gateway_process(up.url, **config)


async def completion(c: httpx.AsyncClient, key: str = KEY) -> httpx.Response:
    r = await c.post("/v1/chat/completions", json=chat(), headers=auth(key))
    await r.aread()
    return r


async def test_a_poison_report_is_a_400_and_takes_nothing_down(upstream, redis_server_own) -> None:
    """The report that once made the recomputed QoE NaN, half-wrote a record, turned
    Redis's refusal into an outage and left NaN rows that broke /qoe and /metrics for
    everyone: refused whole, before anything is written, and nobody else notices."""
    gw = serve(upstream, redis_server_own, fail_mode="closed").start()
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
            rid = (await completion(c)).headers["x-request-id"]
            poison = report(rid, [[0.0, 1000], [1e307, 1]])
            r = await c.post("/v1/tokenpace/telemetry", json=poison, headers=auth(KEY))
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"].startswith("arrivals"), r.text
            # a chunk of 10^18 tokens, a time past a day
            huge = report(rid, [[0.0, 10**18]])
            late = report(rid, [[86_401.0, 1]])
            for body in (huge, late):
                r = await c.post("/v1/tokenpace/telemetry", json=body, headers=auth(KEY))
                assert r.status_code == 400 and "arrivals" in r.json()["error"]["param"], r.text
            # everyone else is served, fail closed included; the operator too
            assert (await completion(c, KEY_GLOBEX)).status_code == 200
            admin = await c.get("/v1/tokenpace/admin/tenants", headers=auth(ADMIN))
            assert admin.status_code == 200, admin.text
            # the request was not marked reported: a good report is still taken
            good = report(rid, [[0.5, 1]])
            r = await c.post("/v1/tokenpace/telemetry", json=good, headers=auth(KEY))
            assert r.status_code == 200, r.text
            await asyncio.sleep(0.5)  # gateway-side records are written in batches
            qoe = await c.get("/v1/tokenpace/qoe", headers=auth(ADMIN))
            assert qoe.status_code == 200
            tenants = strict_json(qoe.text)["tenants"]  # type: ignore[index]
            assert tenants["acme"]["tiers"]["chat"]["client"]["count"] == 1
            scrape = httpx.get(gw.url + "/metrics", timeout=10).text
            assert "NaN" not in scrape and "Inf" not in scrape.replace('le="+Inf"', "")
        assert metric(gw, "tokenpace_store_outages_total") == 0
        assert "Redis unreachable" not in gw.output()
    finally:
        gw.stop()


async def test_a_command_redis_refuses_fails_that_call_alone(upstream, redis_server_own) -> None:
    """A key of the wrong type (as a bug, or a hand edit, would leave) makes Redis refuse
    the QoE write: that report gets a 500, and the store stays up for everyone (fail
    closed: an outage would be 503 for every request)."""
    gw = serve(upstream, redis_server_own, fail_mode="closed").start()
    redis = aioredis.from_url(redis_server_own.url)
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
            rid = (await completion(c)).headers["x-request-id"]
            await redis.delete(P + "tel")
            await redis.set(P + "tel", "not a stream")
            r = await c.post(
                "/v1/tokenpace/telemetry", json=report(rid, [[0.5, 1]]), headers=auth(KEY)
            )
            assert r.status_code == 500 and r.json()["error"]["code"] == "store_error", r.text
            for key in (KEY, KEY_GLOBEX):
                assert (await completion(c, key)).status_code == 200
            assert (await c.get("/v1/tokenpace/admin/tenants", headers=auth(ADMIN))).is_success
        assert metric(gw, "tokenpace_store_errors_total", kind="command") >= 1
        assert metric(gw, "tokenpace_store_outages_total") == 0
        assert metric(gw, "tokenpace_store_mode", mode="redis") == 1
    finally:
        await redis.aclose()
        gw.stop()


async def test_a_poison_record_in_the_replay_buffer_is_dropped(upstream, redis_server_own) -> None:
    """Reports accepted during an outage are replayed when Redis returns; one Redis
    refuses is dropped (logged) and the replica is back on Redis at once, instead of
    retrying the same batch at every reconnect."""
    gw = serve(upstream, redis_server_own, reconnect_interval_s=1.5).start()
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
            rids = [(await completion(c)).headers["x-request-id"] for _ in range(3)]
            redis_server_own.kill()
            for rid in rids:
                r = await c.post(
                    "/v1/tokenpace/telemetry", json=report(rid, [[0.5, 1]]), headers=auth(KEY)
                )
                assert r.status_code == 202, r.text
            redis_server_own.start()  # empty; a key in the way of the replay at once
            redis = aioredis.from_url(redis_server_own.url)
            await redis.set(P + "tel", "not a stream")
            deadline = time.monotonic() + 8.0
            while metric(gw, "tokenpace_store_mode", mode="redis") != 1:
                assert time.monotonic() < deadline, gw.output()[-2000:]
                await asyncio.sleep(0.2)
            rid = (await completion(c)).headers["x-request-id"]
            assert await redis.hget(f"{P}req:{rid}", "tenant") == b"acme"
            await redis.aclose()
        dropped = "buffered client record of {} refused by Redis, dropped"
        assert all(dropped.format(rid) in gw.output() for rid in rids)
    finally:
        gw.stop()


async def test_a_burst_of_streams_waits_for_redis_instead_of_leaving_it(
    upstream, redis_server_own
) -> None:
    """300 streams at once on one process: no call gives up on a healthy Redis (the pool
    of 64 once raised MaxConnectionsError, and the gateway served on local state for a
    second or more). On a loaded 2-core machine the gateway's own event loop lags by
    tenths of a second under such a burst, and each Redis call with it: the timeouts here
    are patient, so that what is measured is the pool, not the machine."""
    patient = {"timeouts": {"connect_s": 20.0, "first_byte_s": 30.0, "idle_s": 30.0}}
    gw = serve(upstream, redis_server_own, sections=patient, timeout_s=5.0).start()
    try:
        for _ in range(2):
            limits = httpx.Limits(max_connections=400, max_keepalive_connections=400)
            async with httpx.AsyncClient(base_url=gw.url, timeout=30, limits=limits) as c:

                async def one(c: httpx.AsyncClient = c) -> None:
                    url, body = "/v1/chat/completions", chat(20)
                    async with c.stream("POST", url, json=body, headers=auth(KEY)) as r:
                        await r.aread()
                        assert r.status_code == 200, r.text

                await asyncio.gather(*(one() for _ in range(300)))
        assert "Redis unreachable" not in gw.output()
        assert metric(gw, "tokenpace_store_outages_total") == 0
        assert metric(gw, "tokenpace_store_local_calls_total") == 0
        assert metric(gw, "tokenpace_store_errors_total") == 0
        assert metric(gw, "tokenpace_store_pool_connections", state="size") == 256
        assert metric(gw, "tokenpace_store_redis_calls_total") > 600
    finally:
        gw.stop()


async def _commands(redis: aioredis.Redis) -> dict[str, int]:
    stats = await redis.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


MAX_BUCKETS = 84  # aggregates.plan: at most this many buckets cover a window of 2 hours or less
UNCOUNTED = {"mget", "info", "hello", "client|setinfo", "client|setname", "select", "auth"}


async def test_a_qoe_summary_costs_the_same_at_ten_times_the_records(
    upstream, redis_server_own
) -> None:
    """/v1/tokenpace/qoe and /metrics once read every record of the window (12 s a call
    at 200,000): their Redis work must not grow with the records."""
    gw = serve(upstream, redis_server_own).start()
    store = RedisStore(redis_server_own.url, PREFIX)
    redis = aioredis.from_url(redis_server_own.url)
    try:
        written = 0

        async def write(n: int) -> None:
            nonlocal written
            batch = [
                QoERecord(f"{written + i:032x}", "acme", "chat", "gateway", 0.9, 0.8, "completed")
                for i in range(n)
            ]
            for i in range(0, n, 1000):
                await store.add_qoe(batch[i : i + 1000])
            written += n

        async def cost(path: str) -> dict[str, int]:
            await asyncio.sleep(1.1)  # past the summary's one-second reuse
            before = await _commands(redis)
            r = httpx.get(gw.url + path, headers=auth(ADMIN), timeout=30)
            assert r.status_code == 200
            after = await _commands(redis)
            return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}

        await write(2_000)
        small = {p: await cost(p) for p in ("/v1/tokenpace/qoe", "/metrics")}
        await write(18_000)
        large = {p: await cost(p) for p in ("/v1/tokenpace/qoe", "/metrics")}
        for path in small:
            assert "xrange" not in large[path], large
            # the same commands (but a key-state check that may fall between), and as many
            # reads as the buckets that cover the hour: how many depends on where the
            # hour's ends fall between bucket boundaries (aggregates.plan), never on the
            # records (one tenant here); a connection the pool opens meanwhile adds its
            # handshake, whatever the records
            kinds = {k for k in large[path] if k not in UNCOUNTED}
            assert kinds == {k for k in small[path] if k not in UNCOUNTED}
            assert small[path]["hgetall"] <= MAX_BUCKETS and large[path]["hgetall"] <= MAX_BUCKETS
        summary = httpx.get(gw.url + "/v1/tokenpace/qoe", headers=auth(ADMIN), timeout=10).json()
        assert summary["tenants"]["acme"]["tiers"]["chat"]["gateway"]["count"] == 20_000
    finally:
        await store.aclose()
        await redis.aclose()
        gw.stop()


async def test_a_replayed_token_never_uses_up_the_tenants_quota(upstream, redis_server_own) -> None:
    """A telemetry token handed to a browser and replayed: refused as used, charged to
    nobody; the tenant's own reports still go through."""
    limit = {"telemetry": {"requests_per_minute": 5}}
    gw = serve(upstream, redis_server_own, sections=limit).start()
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
            first = await completion(c)
            rid, token = first.headers["x-request-id"], first.headers["x-tokenpace-telemetry-token"]
            body = report(rid, [[0.5, 1]])
            header = {"X-TokenPace-Telemetry-Token": token}
            r = await c.post("/v1/tokenpace/telemetry", json=body, headers=header)
            assert r.status_code == 200, r.text
            replays = [
                (await c.post("/v1/tokenpace/telemetry", json=body, headers=header)).status_code
                for _ in range(40)
            ]
            assert set(replays) == {403}
            other = (await completion(c)).headers["x-request-id"]
            r = await c.post(
                "/v1/tokenpace/telemetry", json=report(other, [[0.5, 1]]), headers=auth(KEY)
            )
            assert r.status_code == 200, r.text
    finally:
        gw.stop()


async def test_bodies_without_a_credential_hold_bounded_memory(upstream) -> None:
    """Many connections each sending a telemetry body without a credential: past
    ``telemetry.anonymous_bodies_max_bytes`` held at once, a new one is refused (503)
    before its body is read; the memory they hold stays bounded."""
    budget = 4 * 2**20
    gw = gateway_process(upstream.url, telemetry={"anonymous_bodies_max_bytes": budget}).start()
    size = 255 * 1024
    head = (
        b"POST /v1/tokenpace/telemetry HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
        b"Content-Length: %d\r\n\r\n" % size
    )
    writers: list[asyncio.StreamWriter] = []
    try:
        await asyncio.sleep(0.5)
        rss = gw.rss_mib()

        async def hold() -> bytes:
            """The whole body but its last byte, then wait: the server holds what it read."""
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writers.append(writer)
            writer.write(head + b" " * (size - 1))
            await writer.drain()
            try:
                return await asyncio.wait_for(reader.read(200), 3.0)
            except TimeoutError:
                return b""  # held by the server, reading its body

        answers = await asyncio.gather(*(hold() for _ in range(200)))
        held = sum(1 for a in answers if not a)
        refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
        assert held + len(refused) == 200, [a[:40] for a in answers if a][:3]
        assert 0 < held * size <= budget  # some were read, within the budget
        grown = gw.rss_mib() - rss
        assert grown < 30, grown  # 200 × 255 KiB = 50 MiB if every body were held
        for w in writers:
            w.close()
        writers.clear()
        # once they are gone, the budget is free again
        await asyncio.sleep(0.5)
        r = httpx.post(gw.url + "/v1/tokenpace/telemetry", content=b"{}", timeout=5)
        assert r.status_code == 401
    finally:
        for w in writers:
            w.close()
        gw.stop()


def burn_cpu() -> subprocess.Popen[bytes]:
    """A process that keeps one core busy: the loaded machine of a shared host."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def raw_stream_request(key: str, tokens: int) -> bytes:
    body = json.dumps(chat(tokens)).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n"
        % (key.encode(), len(body))
    ) + body


async def test_a_burst_on_a_healthy_redis_gets_no_store_busy_and_leaves_no_queue_place(
    upstream, redis_server_own
) -> None:
    """300 streams of two tenants sent at once (connections opened first, then every
    request written in one go), with the default ``store.timeout_s`` (0.5 s), on a capped
    backend (most wait in the queue), a core kept busy by another process: 0–77 % of such
    bursts were refused ``store_busy`` while Redis answered in milliseconds (the
    gateway's own loop lag counted as Redis's time), and each call given up left its
    queue place behind until its lease ran out."""
    capped = {"name": "up", "url": f"{upstream.url}/v1", "models": ["bench"]}
    sections = {
        "tenants": [{**t, "max_queued": 300} for t in TENANTS],
        "backends": [{**capped, "health_path": "/health", "max_concurrent": 64}],
        "timeouts": {"connect_s": 20.0, "first_byte_s": 30.0, "idle_s": 30.0},
    }
    gw = serve(upstream, redis_server_own, sections=sections).start()
    burner = burn_cpu()
    redis = aioredis.from_url(redis_server_own.url)
    try:
        connections = [await asyncio.open_connection("127.0.0.1", gw.port) for _ in range(300)]
        for i, (_, writer) in enumerate(connections):
            writer.write(raw_stream_request(KEY if i % 2 else KEY_GLOBEX, 20))

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
            try:
                return await asyncio.wait_for(reader.read(), 60)
            finally:
                writer.close()

        answers = await asyncio.gather(*(answer(r, w) for r, w in connections))
        refused = [a for a in answers if b"store_busy" in a or not a.startswith(b"HTTP/1.1 200")]
        assert not refused, f"{len(refused)} of 300 refused: {refused[0][:600]!r}"
        assert all(b"data: [DONE]" in a and b'"error"' not in a for a in answers)
        assert metric(gw, "tokenpace_store_errors_total") == 0
        assert metric(gw, "tokenpace_store_local_calls_total") == 0
        # nothing held once every stream has ended: no queue place, no slot
        assert await redis.hgetall(P + "wn") == {}
        assert await redis.zcard(P + "wl") == 0
        assert await redis.zcard(P + "s:up") == 0
    finally:
        burner.kill()
        burner.wait()
        await redis.aclose()
        gw.stop()


async def test_an_admission_given_up_leaves_no_queue_place(upstream, redis_server_own) -> None:
    """A backend of one slot, held; Redis stalls (SIGSTOP, 0.8 s) while 20 more streams
    arrive: admission calls time out (``store.timeout_s``, 0.5 s) with their scripts
    sent, Redis answers the PING that follows (so it is busy, not down: 503
    ``store_busy``) and runs the scripts as it wakes (the others wait, and are
    ``overloaded`` at their bound). Each left a queue place counted
    against its tenant's ``max_queued`` until its lease (60 s here) ran out; now the
    gateway undoes what a call whose answer never came may have done."""
    capped = {"name": "up", "url": f"{upstream.url}/v1", "models": ["bench"]}
    sections = {
        "backends": [{**capped, "health_path": "/health", "max_concurrent": 1}],
        "admission": {"lease_s": 60.0},
    }
    gw = serve(upstream, redis_server_own, sections=sections).start()
    redis = aioredis.from_url(redis_server_own.url)
    assert redis_server_own.proc is not None
    pid = redis_server_own.proc.pid
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            url, body = "/v1/chat/completions", chat(4000)
            async with c.stream("POST", url, json=body, headers=auth(KEY)) as held:
                assert held.status_code == 200
                os.kill(pid, signal.SIGSTOP)
                asyncio.get_running_loop().call_later(0.8, os.kill, pid, signal.SIGCONT)
                answers = await asyncio.gather(
                    *(c.post(url, json=chat(5, stream=False), headers=auth(KEY)) for _ in range(20))
                )
                codes = {r.json()["error"]["code"] for r in answers}
                assert codes <= {"store_busy", "overloaded"}, codes  # the latter at the bound
                await asyncio.sleep(1.0)
                assert "Redis unreachable" not in gw.output()  # busy, never down
                assert await redis.hget(P + "wn", "acme") is None  # no place left behind
                assert await redis.zcard(P + "wl") == 0
                assert await redis.zcard(P + "s:up") == 1  # the held stream's, only
    finally:
        os.kill(pid, signal.SIGCONT)
        await redis.aclose()
        gw.stop()


async def test_after_a_redis_stall_nothing_stays_held(upstream, redis_server_own) -> None:
    """Six streams on a backend of four slots (four running, two waiting), then Redis
    stalls (SIGSTOP, 3 s) and every stream ends meanwhile. Four slots and two queue
    places stayed in Redis after "state reconciled", and the next request waited for
    their leases with nothing running: the slots given back and places left during the
    stall are now replayed to Redis when it answers again."""
    capped = {"name": "up", "url": f"{upstream.url}/v1", "models": ["bench"]}
    sections = {
        "backends": [{**capped, "health_path": "/health", "max_concurrent": 4}],
        # acme's plan may hold every slot (by default one stays free for globex)
        "tenants": [{**TENANTS[0], "max_concurrent": 4}, TENANTS[1]],
        "admission": {"lease_s": 60.0},
        "timeouts": {"connect_s": 5.0, "first_byte_s": 10.0, "idle_s": 10.0},
    }
    gw = serve(upstream, redis_server_own, sections=sections, reconnect_interval_s=0.2)
    gw.start()
    redis = aioredis.from_url(redis_server_own.url)
    assert redis_server_own.proc is not None
    pid = redis_server_own.proc.pid
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            url = "/v1/chat/completions"

            async def one() -> str:
                async with c.stream("POST", url, json=chat(200), headers=auth(KEY)) as r:
                    return (await r.aread()).decode()

            streams = [asyncio.create_task(one()) for _ in range(6)]
            while await redis.zcard(P + "s:up") < 4 or await redis.zcard(P + "wl") < 2:
                await asyncio.sleep(0.02)
            os.kill(pid, signal.SIGSTOP)
            try:
                answers = await asyncio.gather(*streams)  # each ends while Redis is stopped
            finally:
                os.kill(pid, signal.SIGCONT)
            assert all("data: [DONE]" in a for a in answers)
            deadline = time.monotonic() + 10
            while "state reconciled" not in gw.output() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert "state reconciled" in gw.output()
            assert await redis.zcard(P + "s:up") == 0
            assert await redis.zcard(P + "wl") == 0
            assert await redis.hgetall(P + "wn") == {}
            started = time.monotonic()
            r = await c.post(url, json=chat(2, stream=False), headers=auth(KEY))
            assert r.status_code == 200 and time.monotonic() - started < 2.0
    finally:
        os.kill(pid, signal.SIGCONT)
        await redis.aclose()
        gw.stop()


async def test_a_stream_waiting_when_redis_runs_out_of_memory_is_served(
    upstream, redis_server_own
) -> None:
    """A backend of one slot, held, one stream waiting; Redis reaches its memory limit
    (every script refused ``OOM``), then the held stream ends. The waiting stream was
    told ``overloaded`` at its bound although the engine was free (the OOM was read as a
    command error); Redis that cannot write is down: the stream is served on local
    state (``fail_mode: open``)."""
    capped = {"name": "up", "url": f"{upstream.url}/v1", "models": ["bench"]}
    sections = {"backends": [{**capped, "health_path": "/health", "max_concurrent": 1}]}
    gw = serve(upstream, redis_server_own, sections=sections).start()
    redis = aioredis.from_url(redis_server_own.url)
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            url = "/v1/chat/completions"

            async def one(tokens: int) -> str:
                async with c.stream("POST", url, json=chat(tokens), headers=auth(KEY)) as r:
                    return (await r.aread()).decode()

            held = asyncio.create_task(one(300))  # 1.5 s at 200 tokens a second
            while await redis.zcard(P + "s:up") < 1:
                await asyncio.sleep(0.02)
            waiting = asyncio.create_task(one(5))
            while await redis.zcard(P + "wl") < 1:
                await asyncio.sleep(0.02)
            await redis.config_set("maxmemory", 1)  # noeviction: every write refused
            started = time.monotonic()
            assert "[DONE]" in await held
            answer = await waiting
            assert "overloaded" not in answer and '"error"' not in answer, answer
            assert "data: [DONE]" in answer
            assert time.monotonic() - started < 5.0  # not at the 10 s bound
            assert "Redis unreachable" in gw.output()  # down, not a command error
    finally:
        await redis.config_set("maxmemory", 0)
        await redis.aclose()
        gw.stop()
