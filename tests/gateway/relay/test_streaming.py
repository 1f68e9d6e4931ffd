"""Streaming hygiene: failover, mid-stream failures, pings, timeouts, disconnects, leaks.

Upstreams are FakeUpstream stand-ins for vLLM on real loopback sockets; the gateway runs
under uvicorn in the test's event loop, so its tasks can be counted.
"""

from __future__ import annotations

import asyncio
import gc
import time

import httpx
import pytest

from gateway.backends import GeneratorChunkStream
from gateway.backends.routing import Lease
from gateway.backends.sse import HttpChunkStream
from gateway.relay.dispatch import Attempt, Failover
from gateway.relay.streaming import StreamRelay
from tests.support.fake_upstream import MODEL, upstream
from tests.support.gateway import backend_entry, data_events, gateway, make_config, sse_lines
from tests.support.ports import free_port
from tests.support.waiting import eventually

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}


def contents(events: list) -> str:
    return "".join(
        e["choices"][0]["delta"].get("content") or ""
        for e in events
        if isinstance(e, dict) and e.get("choices")
    )


async def stream_chat(gw, body=CHAT, **kwargs) -> tuple[httpx.Response, list[str]]:
    async with (
        gw.client() as client,
        client.stream("POST", "/v1/chat/completions", json=body, **kwargs) as resp,
    ):
        return resp, await sse_lines(resp)


def leases_released(gw) -> bool:
    return all(s.in_flight == 0 and s.outstanding_tokens == 0 for s in gw.state.router.states)


@pytest.mark.parametrize(
    "mode", ["http_500", "http_503", "http_429", "garbage_first", "no_done_first"]
)
async def test_failover_before_first_byte(mode):
    async with upstream() as bad, upstream() as good:
        bad.mode = "hang_first" if mode == "no_done_first" else mode
        timeouts = {"first_byte_s": 0.3} if mode == "no_done_first" else {}
        config = make_config(  # least_waiting: a fresh gateway tries the first backend first
            [backend_entry(bad, "bad"), backend_entry(good, "good")],
            timeouts=timeouts,
            routing={"policy": "least_waiting"},
        )
        async with gateway(config) as gw:
            # both up, as their /health says: a start-up check that a loaded machine slowed
            # past its 0.5 s timeout must not decide which one is tried first
            for state in gw.state.router.states:
                state.healthy = True
            resp, lines = await stream_chat(gw)
            assert resp.status_code == 200
            events = data_events(lines)
            assert contents(events) == "t0 t1 t2 t3 t4 t5 " and events[-1] == "[DONE]"
            assert not any(isinstance(e, dict) and "error" in e for e in events)
            assert len(bad.bodies) == 1 and len(good.bodies) == 1  # tried bad first, then good
            assert 'tokenpace_failovers_total{backend="bad"}' in await _metrics(gw)
            if mode != "no_done_first":  # (a non-streaming request has no first byte)
                # non-streaming fails over the same way
                gw.state.router.states[0].healthy = True
                async with gw.client() as client:
                    r = await client.post("/v1/chat/completions", json={**CHAT, "stream": False})
                assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
            assert await eventually(lambda: leases_released(gw))


async def test_failover_when_backend_is_down():
    dead_url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with upstream() as good:
        config = make_config(  # least_waiting: a fresh gateway tries the first backend first
            [backend_entry(dead_url, "dead"), backend_entry(good, "good")],
            routing={"policy": "least_waiting"},
        )
        async with gateway(config) as gw:
            # the start-up health check already marked it down
            assert not gw.state.router.states[0].healthy
            gw.state.router.states[0].healthy = True  # pretend it was fine a moment ago
            _resp, lines = await stream_chat(gw)
            assert contents(data_events(lines)) == "t0 t1 t2 t3 t4 t5 "
            assert not gw.state.router.states[0].healthy  # connection refused marks it down
            async with gw.client() as client:
                ready = await client.get("/readyz")
            assert ready.status_code == 200 and ready.json()["backends"] == {
                "dead": False,
                "good": True,
            }


async def test_no_backend_left_gives_json_error():
    async with upstream() as only:
        only.mode = "http_500"
        async with gateway(make_config([backend_entry(only, "only")])) as gw:
            async with gw.client() as client:
                r = await client.post("/v1/chat/completions", json=CHAT)
                assert r.status_code == 502
                assert r.json()["error"]["type"] == "upstream_error"
                assert r.headers["x-tokenpace-tier"] == "chat" and r.headers["x-request-id"]
                r = await client.post("/v1/chat/completions", json={**CHAT, "stream": False})
                assert r.status_code == 502
            assert leases_released(gw)


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("close_mid", "failed mid-stream"),
        ("garbage_mid", "malformed data"),
        ("error_mid", "engine crashed"),
        ("hang_mid", "sent nothing for too long"),
        ("no_done", "before [DONE]"),
    ],
)
async def test_failure_after_first_byte_ends_with_error_event(mode, message):
    async with upstream() as a, upstream() as b:
        a.mode = mode
        config = make_config(  # least_waiting: a fresh gateway tries the first backend first
            [backend_entry(a, "a"), backend_entry(b, "b")],
            timeouts={"idle_s": 0.3},
            routing={"policy": "least_waiting"},
        )
        async with gateway(config) as gw:
            started = time.monotonic()
            resp, lines = await stream_chat(gw)
            assert resp.status_code == 200
            assert time.monotonic() - started < 3  # the client never hangs
            events = data_events(lines)
            assert events[-1] == "[DONE]"
            error = events[-2]["error"]
            assert message in error["message"]
            assert set(error) >= {"message", "type", "param", "code"}
            if mode != "no_done":
                assert contents(events) == "t0 t1 t2 "  # what came before the failure
            assert len(b.bodies) == 0  # no failover once bytes went out
            assert await eventually(lambda: leases_released(gw))
            metrics = await _metrics(gw)
            assert 'outcome="error"' in metrics
            # the gateway keeps serving everyone else
            a.mode = "ok"
            _resp, lines = await stream_chat(gw)
            assert contents(data_events(lines)) == "t0 t1 t2 t3 t4 t5 "


async def test_pings_while_waiting_for_first_token_then_timeout():
    async with upstream() as slow:
        slow.mode = "hang_first"
        config = make_config(
            [backend_entry(slow, "slow")], timeouts={"first_byte_s": 0.5, "ping_interval_s": 0.1}
        )
        async with gateway(config) as gw:
            started = time.monotonic()
            resp, lines = await stream_chat(gw)
            elapsed = time.monotonic() - started
            assert resp.status_code == 200
            assert lines.count(": ping") >= 3
            events = data_events(lines)
            assert events[-2]["error"]["code"] == "upstream_timeout" and events[-1] == "[DONE]"
            assert 0.4 < elapsed < 3
            # the hung upstream request was closed
            assert await eventually(lambda: len(slow.disconnects) == 1)


async def test_pings_then_tokens():
    async with upstream() as slow:
        slow.first_delay = 0.35
        config = make_config([backend_entry(slow, "slow")], timeouts={"ping_interval_s": 0.1})
        async with gateway(config) as gw:
            _resp, lines = await stream_chat(gw)
            first_data = next(i for i, line in enumerate(lines) if line.startswith("data:"))
            assert first_data >= 2 and all(line == ": ping" for line in lines[:first_data])
            assert contents(data_events(lines)) == "t0 t1 t2 t3 t4 t5 "


async def test_client_disconnect_closes_upstream_within_1s():
    async with (
        upstream(n_tokens=10_000, token_interval=0.01) as fake,
        gateway(make_config([backend_entry(fake, "a")])) as gw,
    ):
        async with gw.client() as client:
            # warm up: the server's own long-lived tasks start now
            await stream_chat(gw, {**CHAT, "max_tokens": 2})
            await asyncio.sleep(0.05)
            gc.collect()
            before = {t for t in asyncio.all_tasks() if not t.done()}

            for _ in range(3):
                async with client.stream("POST", "/v1/chat/completions", json=CHAT) as resp:
                    got = 0
                    async for line in resp.aiter_lines():
                        got += line.startswith("data:")
                        if got == 5:
                            break
                    assert fake.active == 1
                    closed_at = time.monotonic()
                # leaving the block closes the client's connection
                assert await eventually(lambda: fake.active == 0, timeout=1.0)
                assert fake.disconnects and fake.disconnects[-1] - closed_at < 1.0

        assert await eventually(lambda: leases_released(gw))
        assert len(fake.disconnects) == 3
        assert 'outcome="aborted"' in await _metrics(gw)

        def settled() -> bool:
            return not {t for t in asyncio.all_tasks() if not t.done()} - before

        assert await eventually(settled, timeout=2.0), [
            t.get_name() for t in asyncio.all_tasks() - before
        ]
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("tokenpace-pump")]
        # and no per-request object outlives its request
        gc.collect()
        per_request = (StreamRelay, Failover, Attempt, Lease, HttpChunkStream)
        assert not [o for o in gc.get_objects() if isinstance(o, per_request)]


async def test_non_streaming_client_disconnect_closes_upstream():
    async with upstream() as fake:
        fake.mode = "hang_first"  # a long generation
        async with gateway(make_config([backend_entry(fake, "a")])) as gw:
            async with gw.client() as client:
                task = asyncio.create_task(
                    client.post("/v1/chat/completions", json={**CHAT, "stream": False})
                )
                assert await eventually(lambda: len(fake.bodies) == 1)
                task.cancel()  # the client gives up: its connection closes
                cancelled_at = time.monotonic()
                with pytest.raises(asyncio.CancelledError):
                    await task
            assert await eventually(lambda: len(fake.disconnects) == 1, timeout=1.0)
            assert fake.disconnects[0] - cancelled_at < 1.0
            assert await eventually(lambda: leases_released(gw))
            assert 'status="499"' in await _metrics(gw)


async def test_client_gone_while_queued_is_never_sent_upstream():
    """A client that gives up while its request waits for a backend slot: 499, counted
    as gone away, nothing sent upstream, the stream holding the slot unharmed."""
    async with (
        upstream(n_tokens=40, token_interval=0.02) as fake,
        gateway(make_config([backend_entry(fake, "a", max_concurrent=1)])) as gw,
        gw.client() as client,
    ):
        first = asyncio.create_task(stream_chat(gw))
        assert await eventually(lambda: fake.active == 1)
        queued = asyncio.create_task(
            client.post("/v1/chat/completions", json={**CHAT, "stream": False})
        )
        await asyncio.sleep(0.2)  # waiting for the backend's one slot
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        resp, lines = await first
        assert resp.status_code == 200 and lines[-1] == "data: [DONE]"
        assert len(fake.bodies) == 1
        assert await eventually(lambda: leases_released(gw))
        metrics = await _metrics(gw)
        assert 'outcome="gone_away"' in metrics and 'status="499"' in metrics


async def test_many_concurrent_streams():
    async with upstream(token_interval=0.002) as a, upstream(token_interval=0.002) as b:
        config = make_config([backend_entry(a, "a"), backend_entry(b, "b")])
        async with gateway(config) as gw:
            limits = httpx.Limits(max_connections=100)
            async with gw.client(limits=limits) as client:

                async def one() -> list[str]:
                    async with client.stream("POST", "/v1/chat/completions", json=CHAT) as resp:
                        return await sse_lines(resp)

                results = await asyncio.gather(*(one() for _ in range(40)))
            for lines in results:
                assert contents(data_events(lines)) == "t0 t1 t2 t3 t4 t5 "
            # least outstanding work spreads the load over both backends
            assert len(a.bodies) > 5 and len(b.bodies) > 5
            assert await eventually(lambda: leases_released(gw))


async def _metrics(gw) -> str:
    async with gw.client(key="") as client:
        return (await client.get("/metrics")).text


async def test_generator_stream_reads_are_cancel_safe_and_close_stops_it():
    """An in-process generator: cancelled waits lose nothing; aclose cancels the step."""
    steps: list[str] = []

    async def slow_tokens():
        try:
            for i in range(2):
                await asyncio.sleep(0.2)
                yield {"choices": [{"index": 0, "delta": {"content": f"t{i}"}}]}
            await asyncio.sleep(10)
            yield {"choices": []}
        except asyncio.CancelledError:
            steps.append("cancelled")
            raise

    stream = GeneratorChunkStream(slow_tokens())
    got = []
    while len(got) < 2:
        try:
            async with asyncio.timeout(0.05):  # the relay's ping deadline, shorter than a step
                batch = await stream.next_batch()
                got += [c["choices"][0]["delta"]["content"] for c in batch.chunks]
        except TimeoutError:
            steps.append("ping")
    assert got == ["t0", "t1"] and steps.count("ping") >= 4
    with pytest.raises(TimeoutError):  # waiting on the long step, then the client leaves
        async with asyncio.timeout(0.05):
            await stream.next_batch()
    await stream.aclose()
    assert steps[-1] == "cancelled"
    await stream.aclose()  # idempotent


async def test_streamed_body_skips_no_header_or_count():
    """A stream's start goes through every middleware (X-Request-Id, CORS, the request
    counter) while its body goes straight to the server: all of it arrives."""
    async with upstream() as up:
        config = make_config(
            [backend_entry(up, "up")], cors={"allow_origins": ["http://page.example"]}
        )
        async with gateway(config) as gw:
            resp, lines = await stream_chat(gw, headers={"Origin": "http://page.example"})
            assert resp.status_code == 200
            assert len(resp.headers["x-request-id"]) == 32
            assert resp.headers["access-control-allow-origin"] == "http://page.example"
            events = data_events(lines)
            assert contents(events) == "t0 t1 t2 t3 t4 t5 " and events[-1] == "[DONE]"
            counted = [
                line
                for line in (await _metrics(gw)).splitlines()
                if line.startswith("tokenpace_requests_total{")
                and 'endpoint="chat.completions"' in line
            ]
            assert len(counted) == 1 and 'status="200"' in counted[0]
            assert 'outcome="completed"' in counted[0] and counted[0].endswith(" 1.0")


async def test_a_backends_cookie_is_never_sent_back():
    """A backend that sets a cookie on one tenant's stream never sees it again."""
    async with upstream() as up:
        up.stream_headers = [(b"set-cookie", b"session=tenant-a; Path=/")]
        async with gateway(make_config([backend_entry(up, "up")])) as gw:
            for _ in range(2):
                resp, lines = await stream_chat(gw)
                assert resp.status_code == 200 and data_events(lines)[-1] == "[DONE]"
            async with gw.client() as client:
                whole = await client.post("/v1/chat/completions", json={**CHAT, "stream": False})
            assert whole.status_code == 200
    assert len(up.headers) == 3  # the cookie was set on the first answer
    assert not any("cookie" in headers for headers in up.headers)
