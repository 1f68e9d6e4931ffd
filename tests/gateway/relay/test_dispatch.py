"""Dispatch and the request's one hold on a backend (gateway/relay/dispatch.py,
gateway/admission/controller.py).

The hold is the admission ticket: the slot in the store (real Redis) and the router's
lease (in flight, outstanding tokens). A failover takes both to the backend that serves,
and only to one with a free slot; every way a request ends releases both. The client is
the official openai client; the upstreams are the FakeUpstream stand-in for vLLM.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import openai
import pytest

from tests.support.cluster import capped_upstream
from tests.support.fake_upstream import MODEL, FakeUpstream, upstream
from tests.support.gateway import KEY, Gateway, backend_entry, gateway, make_config
from tests.support.ports import free_port
from tests.support.redis_server import RedisServer

MESSAGES = [{"role": "user", "content": "hi"}]
LEASE_S = 0.3  # the heartbeat renews every held slot each LEASE_S / 3


async def held(gw: Gateway) -> dict[str, tuple[int, int, int]]:
    """backend -> (slots in the store, in flight by the router, outstanding tokens)."""
    store = gw.state.store
    return {
        s.name: (await store.in_flight(s.name), s.in_flight, s.outstanding_tokens)
        for s in gw.state.router.states
    }


async def assert_released(gw: Gateway) -> None:
    """Every count back to zero, and still zero after heartbeats (which would re-create
    the store slot of a ticket the gateway still held)."""
    zero = {s.name: (0, 0, 0) for s in gw.state.router.states}
    deadline = time.monotonic() + 3.0
    while await held(gw) != zero and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert await held(gw) == zero
    await asyncio.sleep(LEASE_S)
    assert await held(gw) == zero


@asynccontextmanager
async def two_backends(
    redis_url: str,
    prefix: str,
    backends: dict[str, FakeUpstream | str],
    cap: int = 4,
    store: dict[str, Any] | None = None,
    **overrides: Any,
) -> AsyncIterator[tuple[Gateway, openai.AsyncOpenAI]]:
    """A gateway on Redis in front of ``backends`` (in that order: a fresh gateway's first
    request is granted a slot on the first, by ``least_waiting``'s round robin), each with
    ``cap`` slots."""
    config = make_config(
        [backend_entry(fake, name, max_concurrent=cap) for name, fake in backends.items()],
        store={"redis_url": redis_url, "key_prefix": prefix, **(store or {})},
        admission={"lease_s": LEASE_S, "poll_interval_s": 0.02},
        routing={"policy": "least_waiting"},
        **overrides,
    )
    async with gateway(config) as gw:
        client = openai.AsyncOpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
        try:
            yield gw, client
        finally:
            await client.close()


async def test_failover_moves_the_slot_and_the_lease_to_the_backend_that_serves(
    redis_server, key_prefix
) -> None:
    async with (
        upstream() as bad,
        upstream(n_tokens=40, token_interval=0.02) as good,
        two_backends(redis_server.url, key_prefix, {"bad": bad, "good": good}) as (gw, client),
    ):
        bad.mode = "http_500"
        stream = await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, stream=True, max_tokens=40
        )
        text = ""
        async for chunk in stream:
            text += chunk.choices[0].delta.content or ""
            if text.count("t") == 3:
                break
        assert len(bad.bodies) == 1 and len(good.bodies) == 1  # granted bad, failed over
        now = await held(gw)
        assert now["bad"] == (0, 0, 0)
        slots, in_flight, outstanding = now["good"]
        # the lease went with it; the first token is charged at once (the rest settle later)
        assert (slots, in_flight) == (1, 1) and 0 < outstanding < 40
        async for chunk in stream:
            text += chunk.choices[0].delta.content or ""
        assert text == "".join(f"t{i} " for i in range(40))
        await assert_released(gw)


async def test_failover_never_takes_a_full_backend_past_its_cap(redis_server, key_prefix) -> None:
    async with (
        upstream(n_tokens=10_000, token_interval=0.01) as busy,
        upstream() as bad,
        two_backends(
            redis_server.url,
            key_prefix,
            {"busy": busy, "bad": bad},
            cap=1,
            # one tenant may hold both slots (a plan's default cap keeps one for others)
            tenants=[{"name": "acme", "api_keys": [KEY], "max_concurrent": 2}],
        ) as (gw, client),
    ):
        bad.mode = "http_500"
        long = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
        async for _chunk in long:
            break
        # busy is full: the next request is granted bad's slot, fails there, and busy
        # has no room for its failover
        with pytest.raises(openai.InternalServerError) as caught:
            await client.chat.completions.create(model=MODEL, messages=MESSAGES)
        error: Any = caught.value
        assert error.status_code == 503 and error.code == "backend_unavailable"
        assert "max_concurrent" in error.message and error.response.headers["retry-after"]
        assert len(bad.bodies) == 1 and len(busy.bodies) == 1  # never sent past the cap
        now = await held(gw)
        assert now["bad"] == (0, 0, 0)
        assert now["busy"][:2] == (1, 1)
        await long.close()
        await assert_released(gw)


async def test_a_full_healthy_backend_is_waited_for_not_overflowed_through_a_down_one(
    redis_server, key_prefix
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with (
        capped_upstream(n_tokens=10_000, token_interval=0.01) as busy,
        two_backends(redis_server.url, key_prefix, {"dead": dead, "busy": busy}, cap=1) as (
            gw,
            client,
        ),
    ):
        assert not gw.state.router.state("dead").healthy  # the start-up health check
        long = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
        async for _chunk in long:
            break
        # busy is full and dead is down: the next request waits in the queue for busy
        waiting = asyncio.create_task(
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
        )
        await asyncio.sleep(0.3)
        assert not waiting.done() and len(busy.bodies) == 1
        assert (await held(gw))["dead"] == (0, 0, 0)
        await long.close()
        answer = await waiting
        assert answer.choices[0].message.content == "t0 t1 t2 "
        assert busy.peak == 1
        assert gw.state.router.state("dead").last_error is None  # never attempted
        await assert_released(gw)


async def test_a_failover_while_the_store_is_down_fails_closed(key_prefix) -> None:
    redis = RedisServer().start()  # this test's own: it is killed
    try:
        async with (
            upstream() as bad,
            upstream() as good,
            two_backends(
                redis.url,
                key_prefix,
                {"bad": bad, "good": good},
                store={"fail_mode": "closed", "reconnect_interval_s": 60},
                timeouts={"first_byte_s": 0.5},
            ) as (gw, client),
        ):
            bad.mode = "hang_first"  # admitted on bad, which never sends its first chunk
            stream = await client.chat.completions.create(
                model=MODEL, messages=MESSAGES, stream=True
            )
            redis.kill()  # the slot cannot move now: the request ends, nothing runs on good
            with pytest.raises(openai.APIError, match="shared state is unavailable"):
                async for _chunk in stream:
                    pass
            assert good.bodies == []
            states = gw.state.router.states
            assert [(s.in_flight, s.outstanding_tokens) for s in states] == [(0, 0), (0, 0)]
    finally:
        redis.stop()


async def _stream_to_the_end(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    async for _chunk in stream:
        pass


async def _whole(client: openai.AsyncOpenAI) -> None:
    await client.chat.completions.create(model=MODEL, messages=MESSAGES)


async def _leave_mid_stream(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    seen = 0
    async for _chunk in stream:
        seen += 1
        if seen == 3:
            break
    await stream.close()


async def _leave_before_the_first_chunk(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    await asyncio.sleep(0.2)  # the backend sends nothing: the relay waits for it
    await stream.close()


async def _leave_a_whole_response(client: openai.AsyncOpenAI) -> None:
    task = asyncio.create_task(_whole(client))
    await asyncio.sleep(0.3)  # the backend answers nothing: the dispatcher waits for it
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def _error_mid_stream(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    with pytest.raises(openai.APIError, match="engine crashed"):
        async for _chunk in stream:
            pass


async def _every_backend_fails(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.InternalServerError) as caught:
        await _whole(client)
    assert caught.value.status_code == 502
    with pytest.raises(openai.InternalServerError):
        await _stream_to_the_end(client)


PATHS = {
    "completed stream": ("ok", _stream_to_the_end),
    "completed whole response": ("ok", _whole),
    "client gone mid-stream": ("ok", _leave_mid_stream),
    "client gone before the first chunk": ("hang_first", _leave_before_the_first_chunk),
    "client gone waiting for a whole response": ("hang_first", _leave_a_whole_response),
    "upstream error mid-stream": ("error_mid", _error_mid_stream),
    "failover exhausted": ("http_500", _every_backend_fails),
}


@pytest.mark.parametrize("path", list(PATHS))
async def test_every_end_releases_the_hold_once(redis_server, key_prefix, path) -> None:
    """Each request is granted a slot on ``bad``, fails over to ``good``, then ends as
    ``path`` says: the store's slots and the router's load all return to zero."""
    mode, run = PATHS[path]
    async with (
        upstream() as bad,
        upstream(n_tokens=200, token_interval=0.01) as good,
        two_backends(redis_server.url, key_prefix, {"bad": bad, "good": good}) as (gw, client),
    ):
        bad.mode, good.mode = "http_500", mode
        await run(client)
        assert len(bad.bodies) >= 1 and len(good.bodies) >= 1  # it failed over
        await assert_released(gw)
