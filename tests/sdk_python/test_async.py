"""tokenpace-client, async: the real gateway on its embedded SIMULATED engine, in the test's loop.

The gateway (gateway.app on uvicorn) and the paced streams share the event loop, so the
tests see the engine drop a request the moment the gateway notices a disconnect. The
engine is qos.sim under Andes (no model runs). One test uses the gateway tests' stand-in
for vLLM (FakeUpstream) to fail a stream midway, which the simulated engine never does.
"""

from __future__ import annotations

import asyncio
import time

import openai
import pytest
import pytest_asyncio
import tokenpace_client as tp
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from tokenpace_client.qoe import digestion_starts, token_times
from tokenpace_client.telemetry import TOKEN_HEADER

from gateway.config.schema import DEMO_MODEL
from tests.support.fake_upstream import MODEL, upstream
from tests.support.gateway import KEY, backend_entry, gateway, make_config
from tests.support.sdk_python import HELLO, RecordingTransport, embedded_config, sequences

pytestmark = pytest.mark.asyncio(loop_scope="module")

LONG = {"model": DEMO_MODEL, "messages": HELLO, "max_tokens": 4000, "stream": True}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def gw():
    async with gateway(embedded_config()) as gateway_:
        yield gateway_


def _client(gw, **kwargs) -> tp.AsyncOpenAI:
    return tp.AsyncOpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0, **kwargs)


async def _gone_after(gw, started: float, timeout: float = 1.0) -> float:
    """Seconds from ``started`` until the engine has dropped every sequence."""
    while sequences(gw) and time.monotonic() - started < timeout:
        await asyncio.sleep(0.001)
    return time.monotonic() - started if not sequences(gw) else float("inf")


async def test_async_stream_is_paced_to_the_tier(gw):
    client = _client(gw, tier="fast", telemetry=False)
    async with await client.chat.completions.create(
        model=DEMO_MODEL, messages=HELLO, max_tokens=20, stream=True
    ) as stream:
        chunks = [c async for c in stream]
    assert isinstance(chunks[-1], openai.types.chat.ChatCompletionChunk)
    assert (stream.tier, stream.tds, stream.outcome) == ("fast", 25.0, "completed")
    ideal = digestion_starts(token_times(stream.timeline.arrivals), 25.0)
    late = [s - i for s, i in zip(token_times(stream.timeline.displayed), ideal, strict=True)]
    assert min(late) >= -1e-6 and late[0] < 0.05
    assert sorted(late)[len(late) // 2] < 0.02 and max(late) < 0.25
    await client.close()


async def test_aclose_makes_the_gateway_see_the_disconnect_within_100_ms(gw):
    client = _client(gw, telemetry=False)
    stream = await client.chat.completions.create(**LONG)
    got = 0
    async for chunk in stream:
        got += bool(chunk.choices and chunk.choices[0].delta.content)
        if got == 3:
            break
    assert sequences(gw) == 1
    started = time.monotonic()
    await stream.aclose()
    assert await _gone_after(gw, started) < 0.1
    assert stream.outcome == "aborted"
    await client.close()


async def test_leaving_async_with_closes_the_upstream(gw):
    client = _client(gw, telemetry=False)
    async with await client.chat.completions.create(**LONG) as stream:
        async for _ in stream:
            break
        started = time.monotonic()
    assert await _gone_after(gw, started) < 0.1
    await client.close()


async def test_cancelling_the_consuming_task_closes_the_upstream(gw):
    client = _client(gw, telemetry=False)
    stream = await client.chat.completions.create(**LONG)
    seen = asyncio.Event()

    async def consume() -> None:
        async for _ in stream:
            seen.set()

    task = asyncio.create_task(consume())
    await seen.wait()
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _gone_after(gw, started) < 0.1
    assert stream.outcome == "aborted"
    await client.close()


async def test_async_stream_and_raw_response_wrap_unchanged(gw):
    raw = openai.AsyncOpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
    args = {"model": DEMO_MODEL, "messages": HELLO, "max_tokens": 6, "stream": True}
    plain = [c async for c in await raw.chat.completions.create(**args)]
    upstream_stream = await raw.chat.completions.create(**args)
    assert isinstance(upstream_stream, openai.AsyncStream)
    paced = [c async for c in tp.apace(upstream_stream, tds=500.0, telemetry=False)]
    same = {"exclude": {"id", "created"}}
    assert [c.model_dump(**same) for c in paced] == [c.model_dump(**same) for c in plain]
    response = await raw.chat.completions.with_raw_response.create(
        **args, extra_body={"tokenpace": {"tier": "voice"}}
    )
    stream = tp.apace(response, end="flush", telemetry=False)
    texts = [c.choices[0].delta.content async for c in stream if c.choices]
    assert "".join(t or "" for t in texts) == "".join(
        c.choices[0].delta.content or "" for c in plain if c.choices
    )
    assert (stream.tier, stream.tds, stream.request_id) == (
        "voice",
        3.3,
        response.headers["x-request-id"],
    )
    async with raw.chat.completions.with_streaming_response.create(**args) as streaming:
        streamed = tp.apace(streaming, tds=500.0, telemetry=False)
        assert len([c async for c in streamed]) == len(plain)
    await raw.close()


async def test_telemetry_from_async_streams_matches_the_gateway(gw):
    transport = RecordingTransport()
    sender = tp.TelemetrySender(transport=transport)
    client = _client(gw, telemetry=sender, tier="fast")
    stream = await client.chat.completions.create(
        model=DEMO_MODEL, messages=HELLO, max_tokens=12, stream=True
    )
    [c async for c in stream]
    assert await asyncio.to_thread(sender.flush, 5.0)
    (sent,) = transport.requests  # authenticated by the response's token, not the key
    assert sent.headers[TOKEN_HEADER] == stream.response.headers[TOKEN_HEADER]
    assert "authorization" not in sent.headers
    (request_id, status, answer), *_ = sender.responses
    assert (request_id, status) == (stream.request_id, 200)
    for name in ("andes", "monotone", "displayed_andes", "displayed_monotone"):
        assert answer["qoe"][name] == pytest.approx(getattr(stream.qoe, name), rel=1e-9)
    await client.close()


async def test_opentelemetry_genai_metrics_are_recorded(gw):
    reader = InMemoryMetricReader()
    from opentelemetry import metrics

    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    client = _client(gw, tier="fast", telemetry=False)
    stream = await client.chat.completions.create(
        model=DEMO_MODEL, messages=HELLO, max_tokens=5, stream=True
    )
    [c async for c in stream]
    data = reader.get_metrics_data()
    points = {
        m.name: m.data.data_points
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        if sm.scope.name == "tokenpace-client"
        for m in sm.metrics
    }
    assert set(points) == {
        "gen_ai.client.operation.time_to_first_chunk",
        "gen_ai.client.operation.time_per_output_chunk",
        "gen_ai.client.token.usage",
        "tokenpace.client.displayed_qoe",
    }
    (usage,) = points["gen_ai.client.token.usage"]
    assert usage.sum == 5 and usage.attributes["gen_ai.token.type"] == "output"
    assert usage.attributes["tokenpace.tier"] == "fast"
    (first,) = points["gen_ai.client.operation.time_to_first_chunk"]
    assert first.sum == pytest.approx(stream.timeline.arrivals[0][0])
    (per_chunk,) = points["gen_ai.client.operation.time_per_output_chunk"]
    assert per_chunk.count == 4
    kinds = {p.attributes["tokenpace.qoe"]: p.sum for p in points["tokenpace.client.displayed_qoe"]}
    assert kinds == {
        "andes": pytest.approx(stream.qoe.displayed_andes),
        "monotone": pytest.approx(stream.qoe.displayed_monotone),
    }
    await client.close()


async def test_upstream_error_is_raised_after_the_tokens_already_received():
    async with upstream(token_interval=0.001) as fake:
        fake.mode = "error_mid"  # the stand-in fails after 3 tokens
        async with gateway(make_config([backend_entry(fake, "up")])) as gw_:
            client = tp.AsyncOpenAI(
                base_url=gw_.base_url, api_key=KEY, max_retries=0, telemetry=False, tier="fast"
            )
            stream = await client.chat.completions.create(model=MODEL, messages=HELLO, stream=True)
            texts = []
            with pytest.raises(openai.APIError, match="engine crashed"):
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        texts.append((time.monotonic(), chunk.choices[0].delta.content))
            assert [t for _, t in texts] == ["t0 ", "t1 ", "t2 "]
            assert texts[-1][0] - texts[0][0] >= 2 / 25 - 0.005  # paced, not dumped
            assert stream.outcome == "error"
            await client.close()
