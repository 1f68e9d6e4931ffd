"""Overload is visible: queue notices, then the reply or ``overloaded`` at the tier's
bound (``queue`` mode); 503 ``overloaded`` at once past the estimated wait (``reject``
mode); the official openai clients, sync and async, streaming or not, on each.

The upstream is the FakeUpstream stand-in for vLLM, capped by ``max_concurrent: 1``: one
long stream (the holder) keeps the next request waiting for as long as it lasts.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import openai
import pytest
import tokenpace_client as tp

from tests.gateway.admission.test_controller import KEY, one_replica
from tests.support.cluster import CappedUpstream, chat
from tests.support.fake_upstream import MODEL
from tests.support.gateway import Gateway

INTERVAL = 0.05  # s between two tokens of the upstream


def bounded(bound_s: float, mode: str = "queue") -> dict[str, Any]:
    """Configuration: the chat tier's overload bound, the overload mode."""
    chat_tier = {"ttft": 1.0, "tds": 4.8, "priority": 1, "overload_after_s": bound_s}
    admission = {"poll_interval_s": 0.02, "overload": mode}
    return {"tiers": {"chat": chat_tier}, "admission": admission}


@asynccontextmanager
async def capped(key_prefix: str, bound_s: float, mode: str = "queue") -> AsyncIterator[Gateway]:
    fake = CappedUpstream(n_tokens=1000, token_interval=INTERVAL)
    async with one_replica(fake, key_prefix, max_concurrent=1, **bounded(bound_s, mode)) as gw:
        yield gw


@asynccontextmanager
async def holding(gw: Gateway, seconds: float) -> AsyncIterator[float]:
    """A stream that holds the only slot for about ``seconds`` (yields when it has it),
    or until the block ends (the client leaves)."""
    tokens = max(1, round(seconds / INTERVAL))
    async with (
        gw.client(KEY) as c,
        c.stream("POST", "/v1/chat/completions", json=chat(stream=True, max_tokens=tokens)) as r,
    ):
        lines = r.aiter_lines()
        async for line in lines:  # the first token: admitted
            if line.startswith("data: {"):
                break
        started = time.monotonic()
        reader = asyncio.create_task(_drain(lines))
        try:
            yield started
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)


async def _drain(lines: AsyncIterator[str]) -> None:
    async for _ in lines:
        pass


def sample(gw: Gateway, name: str, **labels: str) -> float:
    return gw.state.metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_waiting_stream_is_answered_at_once_and_told_its_place(key_prefix) -> None:
    async with capped(key_prefix, 30.0) as gw, holding(gw, 2.5), gw.client(KEY) as c:
        t0 = time.monotonic()
        got: dict[str, list[tuple[float, str]]] = {"a": [], "b": []}

        async def waiting(name: str, tokens: int) -> int:
            body = chat(name, stream=True, max_tokens=tokens)
            async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                got[name].append((time.monotonic() - t0, f"status {r.status_code}"))
                async for line in r.aiter_lines():
                    if line:
                        got[name].append((time.monotonic() - t0, line))
                return r.status_code

        first = asyncio.create_task(waiting("a", 30))  # a holds the slot 1.5 s in turn
        await asyncio.sleep(0.2)
        assert await asyncio.gather(first, waiting("b", 3)) == [200, 200]
        for name, place in (("a", 1), ("b", 2)):
            (at, status), *lines = got[name]
            assert status == "status 200" and at < 1.0, got[name]  # answered at once
            notices = [(t, line) for t, line in lines if line.startswith(": queued ")]
            data = [(t, line) for t, line in lines if line.startswith("data: ")]
            assert notices and notices[0][1].startswith(f": queued position={place} eta_s=")
            # about once a second, all before the first token
            assert len(notices) >= 2 and notices[-1][0] < data[0][0]
            gaps = [b[0] - a[0] for a, b in itertools.pairwise(notices)]
            assert all(0.5 < g < 2.0 for g in gaps), gaps
            fields = dict(f.split("=") for f in notices[0][1].split()[2:])
            assert int(fields["position"]) == place and float(fields["eta_s"]) >= 0
            assert data[-1][1] == "data: [DONE]" and sum('"t2 "' in x for _, x in data) == 1
        # b moved up to position 1 once a was admitted
        assert any(line.startswith(": queued position=1 ") for _, line in got["b"])
        assert sample(gw, "tokenpace_queued_with_notice_total", tenant="acme", tier="chat") == 2


async def reply(client: openai.AsyncOpenAI, stream: bool, max_tokens: int = 3) -> str:
    """One chat request through the openai client: the reply's text."""
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    if not stream:
        done = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=max_tokens
        )
        return done.choices[0].message.content or ""
    chunks = await client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=max_tokens, stream=True
    )
    return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])


@pytest.mark.parametrize("stream", [True, False])
async def test_async_openai_client_is_served_after_the_wait(key_prefix, stream) -> None:
    async with capped(key_prefix, 30.0) as gw, holding(gw, 1.0):
        client = openai.AsyncOpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
        t0 = time.monotonic()
        assert await reply(client, stream) == "t0 t1 t2 " and time.monotonic() - t0 > 0.5
        await client.close()


async def test_the_python_sdk_hears_the_gateways_notices(key_prefix) -> None:
    """tokenpace-client's drop-in client hands the gateway's notices to ``on_queued``
    while the request waits, then paces the reply."""
    async with capped(key_prefix, 30.0) as gw, holding(gw, 1.5):
        heard: list[tuple[float, int, float]] = []
        client = tp.AsyncOpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0, telemetry=False)
        t0 = time.monotonic()
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3,
            stream=True,
            on_queued=lambda position, eta_s: heard.append((time.monotonic(), position, eta_s)),
        )
        async with stream:
            chunks = [c async for c in stream]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
            "t0 t1 t2 "
        )
        assert len(heard) >= 2 and {p for _, p, _ in heard} == {1}
        assert heard[0][0] - t0 < 0.5 and all(e >= 0 for _, _, e in heard)
        assert stream.queued == tp.QueueNotice(heard[-1][1], heard[-1][2])
        await client.close()


@pytest.mark.parametrize("stream", [True, False])
async def test_async_openai_client_sees_overloaded_at_the_bound(key_prefix, stream) -> None:
    """The bound passes while the holder still has the slot: a stream (200 already sent)
    ends with the error event (APIError), a whole response is 503 with Retry-After
    (InternalServerError)."""
    async with capped(key_prefix, 0.6) as gw, holding(gw, 3.0):
        client = openai.AsyncOpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
        t0 = time.monotonic()
        with pytest.raises(openai.APIError) as err:
            await reply(client, stream)
        assert err.value.code == "overloaded"
        if not stream:
            assert isinstance(err.value, openai.InternalServerError)
            assert err.value.status_code == 503
            assert int(err.value.response.headers["retry-after"]) >= 1
        assert 0.5 < time.monotonic() - t0 < 2.0
        assert "waited 0.6 s" in err.value.message
        answer = "in_stream" if stream else "at_bound"
        labels = {"tenant": "acme", "tier": "chat", "answer": answer}
        assert sample(gw, "tokenpace_overloaded_total", **labels) == 1
        await client.close()


async def test_the_async_client_retries_the_503_after_retry_after(key_prefix) -> None:
    """Non-streaming, queue mode: 503 at the 0.5 s bound with Retry-After; the openai
    client waits that long and tries again, and by then the slot is free."""
    async with capped(key_prefix, 0.5) as gw:
        client = openai.AsyncOpenAI(base_url=gw.base_url, api_key=KEY, max_retries=2)
        async with holding(gw, 1.2):
            t0 = time.monotonic()
            assert await reply(client, False, 2) == "t0 t1 "
        assert time.monotonic() - t0 >= 1.4  # the bound, then at least a second's wait
        labels = {"tenant": "acme", "tier": "chat", "answer": "at_bound"}
        assert sample(gw, "tokenpace_overloaded_total", **labels) >= 1
        statuses = {
            s.labels["status"]: s.value
            for m in gw.state.metrics.registry.collect()
            if m.name == "tokenpace_requests"
            for s in m.samples
            if s.name == "tokenpace_requests_total"
        }
        assert statuses["503"] >= 1 and statuses["200"] >= 2  # the holder and the retry
        await client.close()


async def test_reject_mode_answers_503_at_once_past_the_estimate(key_prefix) -> None:
    """One admission 1.2 s ago and none since: the next request's estimated wait is over
    1 s, past the 0.5 s bound, so it gets 503 at once (no 200, no notices); the openai
    client retries after Retry-After until the slot is free."""
    async with capped(key_prefix, 0.5, "reject") as gw, gw.client(KEY) as c:
        client = openai.AsyncOpenAI(base_url=gw.base_url, api_key=KEY, max_retries=4)
        async with holding(gw, 2.0) as held:
            await asyncio.sleep(1.2 - (time.monotonic() - held))
            t0 = time.monotonic()
            r = await c.post("/v1/chat/completions", json=chat(stream=True))
            assert time.monotonic() - t0 < 0.4
            assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded"
            assert "would wait about" in r.json()["error"]["message"]
            assert int(r.headers["retry-after"]) >= 1
            assert r.headers["x-tokenpace-tier"] == "chat"
            assert await reply(client, True, 2) == "t0 t1 "
        labels = {"tenant": "acme", "tier": "chat", "answer": "at_arrival"}
        assert sample(gw, "tokenpace_overloaded_total", **labels) >= 2  # the post, a try
        assert sample(gw, "tokenpace_queued_with_notice_total", tenant="acme", tier="chat") == 0
        await client.close()


async def test_reject_mode_waits_silently_within_the_estimate(key_prefix) -> None:
    """The estimate is within the bound (an admission just now): the stream waits with no
    200 sent, and gets 503 once the bound passes."""
    async with capped(key_prefix, 0.6, "reject") as gw, gw.client(KEY) as c:
        async with holding(gw, 3.0):
            t0 = time.monotonic()
            r = await c.post("/v1/chat/completions", json=chat(stream=True))
            assert 0.5 < time.monotonic() - t0 < 2.0
            assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded"
        labels = {"tenant": "acme", "tier": "chat", "answer": "at_bound"}
        assert sample(gw, "tokenpace_overloaded_total", **labels) == 1


def test_sync_openai_client_queued_stream_then_overloaded(key_prefix) -> None:
    """The synchronous client (the gateway on a loop in another thread): a queued stream
    is served after the wait; one past the bound raises APIError ``overloaded``; a
    whole response past the bound is retried after Retry-After."""
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def serve() -> None:
        async with capped(key_prefix, 0.8) as gw:
            state["gw"], state["loop"] = gw, asyncio.get_running_loop()
            state["stop"] = asyncio.Event()
            ready.set()
            await state["stop"].wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    gw, loop = state["gw"], state["loop"]

    def hold(seconds: float) -> Any:
        async def run() -> None:
            async with holding(gw, seconds):
                await asyncio.sleep(seconds)

        return asyncio.run_coroutine_threadsafe(run(), loop)

    try:
        client = openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
        messages = [{"role": "user", "content": "hi"}]
        held = hold(0.5)
        time.sleep(0.3)
        chunks = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=3, stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
            "t0 t1 t2 "
        )
        held.result(10)
        held = hold(3.0)
        time.sleep(0.3)
        chunks = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=3, stream=True
        )
        with pytest.raises(openai.APIError) as err:
            list(chunks)
        assert err.value.code == "overloaded"
        retrying = openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=4)
        done = retrying.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
        assert done.choices[0].message.content == "t0 t1 "
        labels = {"tenant": "acme", "tier": "chat", "answer": "at_bound"}
        assert sample(gw, "tokenpace_overloaded_total", **labels) >= 1  # then retried
        held.result(10)
        client.close()
        retrying.close()
    finally:
        loop.call_soon_threadsafe(state["stop"].set)
        thread.join(10)


async def test_a_client_gone_while_queued_leaves_the_queue(key_prefix) -> None:
    async with capped(key_prefix, 30.0) as gw, holding(gw, 1.0), gw.client(KEY) as c:
        async with c.stream("POST", "/v1/chat/completions", json=chat(stream=True)) as r:
            lines = r.aiter_lines()
            assert (await anext(lines)).startswith(": queued position=1")
        for _ in range(50):
            if not gw.state.admission._waiters.get(MODEL):
                break
            await asyncio.sleep(0.02)
        assert not gw.state.admission._waiters.get(MODEL)
        assert sample(gw, "tokenpace_queue_waiting") == 0
    assert await gw.state.store.in_flight("up") == 0


async def test_a_waiting_stream_ends_when_the_drain_runs_out(key_prefix) -> None:
    """A stream answered 200 while it waits is one the gateway's drain ends too: an
    OpenAI error event, ``server_shutting_down``, then ``[DONE]``."""
    fake = CappedUpstream(n_tokens=1000, token_interval=INTERVAL)
    config = {**bounded(30.0), "server": {"drain_s": 0.3}}
    async with (
        one_replica(fake, key_prefix, max_concurrent=1, **config) as gw,
        holding(gw, 10.0),
        gw.client(KEY) as c,
        c.stream("POST", "/v1/chat/completions", json=chat("w", stream=True)) as r,
    ):
        assert r.status_code == 200
        lines = r.aiter_lines()
        async for line in lines:
            if line.startswith(": queued "):
                break
        gw.state.drain.begin()
        events = [line async for line in lines if line.startswith("data: ")]
    assert len(events) == 2 and events[-1] == "data: [DONE]", events  # never reached the engine
    assert json.loads(events[0][6:])["error"]["code"] == "server_shutting_down"


async def test_a_reader_who_left_while_queued_gives_up_the_place(key_prefix) -> None:
    """A ``left`` signal for a stream still waiting in the queue ends it with ``[DONE]``
    alone (no error), and its place is given up; the request is counted aborted."""
    async with (
        capped(key_prefix, 30.0) as gw,
        holding(gw, 10.0),
        gw.client(KEY) as c,
        c.stream("POST", "/v1/chat/completions", json=chat("w", stream=True)) as r,
    ):
        assert r.status_code == 200
        lines = r.aiter_lines()
        assert (await anext(lines)).startswith(": queued position=1")
        rid = r.headers["x-request-id"]
        left = await c.post("/v1/tokenpace/reader", json={"request_id": rid, "presence": "left"})
        assert left.status_code == 202, left.text
        rest = [line async for line in lines if line and not line.startswith(": ")]
        assert rest == ["data: [DONE]"]
        for _ in range(50):
            if not gw.state.admission._waiters.get(MODEL):
                break
            await asyncio.sleep(0.02)
        assert not gw.state.admission._waiters.get(MODEL)
        assert sample(gw, "tokenpace_queue_waiting") == 0
    labels = {"tenant": "acme", "tier": "chat", "backend": "-", "endpoint": "chat.completions"}
    aborted = {**labels, "status": "200", "outcome": "aborted"}
    assert sample(gw, "tokenpace_requests_total", **aborted) == 1
