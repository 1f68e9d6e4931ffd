"""Reader signals through the gateway: ``POST /v1/tokenpace/reader`` to the engine.

Real uvicorn servers in the test's loop, a real Redis for the replicas' channel, the
fake upstream as the engine (it records when its stream lost the gateway) and the
embedded simulated engine for an engine in process.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import redis.asyncio as aioredis

from gateway.backends.embedded import EmbeddedEngine
from gateway.config.schema import DEMO_MODEL
from gateway.relay.reader import MAX_BODY_BYTES
from gateway.telemetry.tokens import TOKEN_HEADER
from qos.policy.table import NO_TOKEN
from qos.signals import MIN_INTERVAL_S, Presence, ReaderSignal, channel, decode_wire
from tests.support.fake_upstream import MODEL, upstream
from tests.support.gateway import KEY_BASIC, backend_entry, gateway, make_config
from tests.support.redis_server import RedisServer
from tests.support.waiting import eventually

URL = "/v1/tokenpace/reader"
LONG = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}


def config(fake, **overrides):
    return make_config([backend_entry(fake, "up")], **overrides)


async def served(gw) -> tuple[str, str]:
    """A finished stream's request id and telemetry token."""
    async with gw.client() as c:
        r = await c.post("/v1/chat/completions", json=LONG)
        assert r.status_code == 200, r.text
        return r.headers["x-request-id"], r.headers[TOKEN_HEADER]


def error(r: httpx.Response) -> dict:
    body = r.json()["error"]
    assert set(body) >= {"message", "type", "param", "code"}
    return body


async def test_a_signal_is_accepted_with_the_key_or_the_token_and_the_token_stays_valid() -> None:
    async with upstream() as fake, gateway(config(fake)) as gw:
        rid, token = await served(gw)
        async with gw.client() as acme, gw.client("") as anon:
            r = await acme.post(URL, json={"request_id": rid, "presence": "away"})
            assert r.status_code == 202, r.text
            assert r.json() == {
                "object": "tokenpace.reader_signal",
                "request_id": rid,
                "presence": "away",
            }
            r = await anon.post(
                URL,
                json={"request_id": rid, "presence": "watching", "buffer_tokens": 3},
                headers={TOKEN_HEADER: token},
            )
            assert r.status_code == 202, r.text
            # sendBeacon: text/plain, the token in the body
            beacon = f'{{"request_id":"{rid}","presence":"left","telemetry_token":"{token}"}}'
            r = await anon.post(URL, content=beacon, headers={"Content-Type": "text/plain"})
            assert r.status_code == 202, r.text
            # the token was not used up: the QoE report still takes it
            report = {
                "request_id": rid,
                "expected": {"ttft": 1.0, "tds": 4.8},
                "arrivals": [[0.1, 6]],
                "outcome": "completed",
            }
            r = await anon.post(
                "/v1/tokenpace/telemetry", json=report, headers={TOKEN_HEADER: token}
            )
            assert r.status_code == 200, r.text


async def test_bad_signals_get_an_answer_naming_what_to_fix() -> None:
    async with upstream() as fake, gateway(config(fake)) as gw:
        rid, token = await served(gw)
        other, _ = await served(gw)
        async with gw.client() as acme, gw.client(KEY_BASIC) as basic, gw.client("") as anon:
            for body, param in [
                ({"request_id": rid, "presence": "gone"}, "presence"),
                ({"request_id": rid}, "presence"),
                ({"request_id": rid, "presence": "away", "pace_tps": -1}, "pace_tps"),
                ({"request_id": rid, "presence": "away", "pace_tps": "4"}, "pace_tps"),
                ({"request_id": rid, "presence": "away", "buffer_tokens": 1.5}, "buffer_tokens"),
                ({"request_id": rid, "presence": "away", "buffer_tokens": -1}, "buffer_tokens"),
                ({"presence": "away"}, "request_id"),
                ({"request_id": "", "presence": "away"}, "request_id"),
            ]:
                r = await acme.post(URL, json=body)
                assert r.status_code == 400, (body, r.text)
                e = error(r)
                assert (e["type"], e["param"]) == ("invalid_request_error", param), (body, e)
            r = await acme.post(URL, content=b"[1, 2]")
            assert r.status_code == 400
            r = await acme.post(URL, content=b"{not json")
            assert r.status_code == 400
            # no credential; a forged token; another request's token
            assert (
                await anon.post(URL, json={"request_id": rid, "presence": "away"})
            ).status_code == 401
            r = await anon.post(
                URL,
                json={"request_id": rid, "presence": "away"},
                headers={TOKEN_HEADER: "tpt1.x.y"},
            )
            assert r.status_code == 401
            r = await anon.post(
                URL, json={"request_id": other, "presence": "away"}, headers={TOKEN_HEADER: token}
            )
            assert r.status_code == 403
            assert error(r)["code"] == "telemetry_token_mismatch"
            # another tenant's request, or one nobody served: 404, the same answer
            theirs = await basic.post(URL, json={"request_id": rid, "presence": "away"})
            nobody = await acme.post(URL, json={"request_id": "0" * 32, "presence": "away"})
            assert theirs.status_code == nobody.status_code == 404
            assert error(theirs)["code"] == "request_not_found"
            # a body over the cap, before it is parsed
            big = {"request_id": rid, "presence": "away", "pad": "x" * MAX_BODY_BYTES}
            assert (await acme.post(URL, json=big)).status_code == 413
        text = (await gw.client().get("/metrics")).text
        assert 'tokenpace_reader_signals_refused_total{reason="invalid"} 10.0' in text
        assert 'tokenpace_reader_signals_refused_total{reason="not_yours"} 3.0' in text


async def test_signals_faster_than_the_interval_are_refused_unless_the_presence_changes() -> None:
    async with upstream() as fake, gateway(config(fake)) as gw:
        rid, _ = await served(gw)
        async with gw.client() as acme:
            body = {"request_id": rid, "presence": "watching", "buffer_tokens": 4}
            assert (await acme.post(URL, json=body)).status_code == 202
            r = await acme.post(URL, json={**body, "buffer_tokens": 0})
            assert r.status_code == 429, r.text
            assert error(r)["code"] == "reader_signal_rate"
            assert error(r)["type"] == "rate_limit_error"
            assert 0 < float(r.headers["retry-after"]) <= 1
            # a change of presence always passes, and starts the interval again
            assert (await acme.post(URL, json={**body, "presence": "away"})).status_code == 202
            assert (await acme.post(URL, json={**body, "presence": "away"})).status_code == 429
            assert (await acme.post(URL, json=body)).status_code == 202
            await asyncio.sleep(MIN_INTERVAL_S)
            assert (await acme.post(URL, json={**body, "buffer_tokens": 0})).status_code == 202
        text = (await gw.client().get("/metrics")).text
        assert 'tokenpace_reader_signals_refused_total{reason="rate"} 2.0' in text
        assert 'tokenpace_reader_signals_total{presence="away",tenant="acme"} 1.0' in text
        assert 'tokenpace_reader_signals_total{presence="watching",tenant="acme"} 3.0' in text


async def read_until_tokens(lines, n: int) -> int:
    """Read an SSE stream's data lines until ``n`` token chunks came; how many came."""
    seen = 0
    async for line in lines:
        if line.startswith("data: {") and '"content":"t' in line.replace(" ", ""):
            seen += 1
            if seen >= n:
                return seen
    return seen


async def test_left_ends_the_stream_cleanly_closes_the_upstream_and_charges_what_was_sent() -> None:
    admin_key = "tp-admin-reader-signals"
    async with (
        upstream(n_tokens=400, token_interval=0.02) as fake,
        gateway(config(fake, admin={"key": admin_key})) as gw,
    ):
        async with gw.client() as acme, acme.stream("POST", "/v1/chat/completions", json=LONG) as r:
            assert r.status_code == 200
            rid = r.headers["x-request-id"]
            lines = r.aiter_lines()
            assert await read_until_tokens(lines, 3) == 3
            metrics = (await acme.get("/metrics")).text
            assert 'tokenpace_reader_streams{presence="watching"} 1.0' in metrics
            away = await acme.post(URL, json={"request_id": rid, "presence": "away"})
            assert away.status_code == 202
            metrics = (await acme.get("/metrics")).text
            assert 'tokenpace_reader_streams{presence="away"} 1.0' in metrics
            tds = float(r.headers["X-TokenPace-TDS"])
            assert f"tokenpace_reader_pace_away_tps {tds}" in metrics  # the capacity given back
            async with gw.client(admin_key) as admin:  # the operator's dashboard reads it here
                status = (await admin.get("/v1/tokenpace/admin/status")).json()
            assert status["readers"] == {"watching": 0, "away": 1, "pace_away_tps": tds}
            started = time.monotonic()
            left = await acme.post(URL, json={"request_id": rid, "presence": "left"})
            assert left.status_code == 202
            rest = [line async for line in lines if line]
        assert time.monotonic() - started < 2.0  # not the 8 s the reply had left
        assert rest[-1] == "data: [DONE]"
        assert not any('"error"' in line for line in rest)
        assert await eventually(lambda: len(fake.disconnects) == 1)
        metrics = (await gw.client().get("/metrics")).text
        assert 'outcome="aborted"' in metrics
        sent = [m for m in metrics.splitlines() if m.startswith("tokenpace_output_tokens_total{")]
        assert len(sent) == 1 and 3 <= float(sent[0].split()[-1]) < 400
        assert 'tokenpace_reader_streams{presence="away"} 0.0' in metrics
        assert "tokenpace_reader_pace_away_tps 0.0" in metrics


async def test_the_embedded_engine_records_the_signal_in_its_table() -> None:
    engine = EmbeddedEngine("sim", time_scale=0.1)  # a token every ~70 ms
    cfg = make_config([{"name": "sim", "kind": "embedded", "models": [DEMO_MODEL]}])
    body = {**LONG, "model": DEMO_MODEL, "max_tokens": 600}
    async with gateway(cfg, backends=[engine]) as gw:
        async with gw.client() as acme, acme.stream("POST", "/v1/chat/completions", json=body) as r:
            rid = r.headers["x-request-id"]
            lines = r.aiter_lines()
            async for line in lines:
                if '"content":"' in line and '"content":""' not in line:
                    break
            key = f"{rid}/0"
            table = engine.engine.table
            signal = {"request_id": rid, "presence": "away", "pace_tps": 2.0, "buffer_tokens": 7}
            assert (await acme.post(URL, json=signal)).status_code == 202
            row = table.row(key)
            assert table.col("away_until")[row] > engine.engine.clock
            assert table.col("reader_pace")[row] == 2.0
            assert table.col("stated_buffer")[row] == 7
            await asyncio.sleep(MIN_INTERVAL_S)
            back = {"request_id": rid, "presence": "watching"}
            assert (await acme.post(URL, json=back)).status_code == 202
            assert table.col("away_until")[table.row(key)] == NO_TOKEN
            assert (await acme.post(URL, json={**back, "presence": "left"})).status_code == 202
            rest = [line async for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        assert await eventually(lambda: key not in engine.engine.table)


async def test_a_signal_reaching_any_replica_reaches_the_one_relaying(
    redis_server: RedisServer, key_prefix: str
) -> None:
    store = {"redis_url": redis_server.url, "key_prefix": key_prefix}
    engine_side = aioredis.from_url(redis_server.url)
    pubsub = engine_side.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(channel(key_prefix))
    async with (
        upstream(n_tokens=400, token_interval=0.02) as fake,
        gateway(config(fake, store=store)) as a,
        gateway(config(fake, store=store)) as b,
    ):
        for gw in (a, b):
            assert await eventually(
                lambda gw=gw: all(
                    listener.subscribed.is_set()
                    for listener in gw.state.store.redis.listeners  # type: ignore[attr-defined]
                )
            )
        async with a.client() as ca, b.client() as cb:
            async with ca.stream("POST", "/v1/chat/completions", json=LONG) as r:
                rid = r.headers["x-request-id"]
                lines = r.aiter_lines()
                assert await read_until_tokens(lines, 2) == 2
                signal = {"request_id": rid, "presence": "left", "buffer_tokens": 2}
                assert (await cb.post(URL, json=signal)).status_code == 202
                rest = [line async for line in lines if line]
            assert rest[-1] == "data: [DONE]"
        assert await eventually(lambda: len(fake.disconnects) == 1)
        # what an engine subscribed to the channel hears: the contract's wire message
        message = None
        for _ in range(50):
            message = await pubsub.get_message(timeout=0.1)
            if message is not None:
                break
        assert message is not None
        assert decode_wire(message["data"]) == (
            rid,
            ReaderSignal(Presence.LEFT, buffer_tokens=2),
        )
        # a message that is not a signal is dropped and counted, the channel goes on
        await engine_side.publish(channel(key_prefix), b"{nonsense")
        assert await eventually(lambda: a.state.readers.malformed == 1)
    await pubsub.aclose()
    await engine_side.aclose()
