"""The embedded SIMULATED engine served over HTTP (gateway/runtime/engine_server.py), as the
workers of ``tokenpace serve --workers N`` reach it: a real uvicorn on a loopback port
(in a thread), the official openai client."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import openai
import pytest
import redis

from gateway.backends.embedded import OWNED_BY, EmbeddedEngine
from gateway.config.loader import demo_config
from gateway.config.schema import DEMO_MODEL
from gateway.runtime.engine_server import EngineServer
from qos.signals import Presence, ReaderSignal, channel, encode_wire
from tests.support.redis_server import RedisServer

HELLO = [{"role": "user", "content": "Hello!"}]


@pytest.fixture(scope="module")
def server() -> Iterator[EngineServer]:
    config, _ = demo_config(backends=[])
    one_at_a_time = EmbeddedEngine("one", time_scale=8, max_sequences=1)
    s = EngineServer([EmbeddedEngine("sim", time_scale=8), one_at_a_time], config)
    s.start()
    yield s
    s.stop()


def test_streams_and_answers_as_an_openai_server(server: EngineServer) -> None:
    client = openai.OpenAI(base_url=server.url("sim"), api_key="unused", max_retries=0)
    tags = {"tp_tier": "voice", "tp_ttft": 1.0, "tp_tds": 3.3, "tp_tenant": "acme"}
    stream = client.chat.completions.create(
        model=DEMO_MODEL,
        messages=HELLO,
        stream=True,
        max_tokens=5,
        stream_options={"include_usage": True},
        extra_body={"vllm_xargs": {**tags, "tp_request_id": "req-42"}},
    )
    chunks = list(stream)
    assert {c.id for c in chunks} == {"chatcmpl-req-42"}  # the gateway's request id tag
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("Simulated reply:")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    whole = client.completions.create(model=DEMO_MODEL, prompt="Hi", max_tokens=3)
    assert whole.usage is not None and whole.usage.completion_tokens == 3
    assert [m.owned_by for m in client.models.list().data] == [OWNED_BY]
    assert httpx.get(f"{server.url('sim')}/health").status_code == 200


def test_refusals_are_openai_errors(server: EngineServer) -> None:
    client = openai.OpenAI(base_url=server.url("sim"), api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:  # beyond the simulated KV cache
        client.chat.completions.create(model=DEMO_MODEL, messages=HELLO, max_tokens=10**7)
    assert err.value.code == "context_length_exceeded"
    bad = httpx.post(f"{server.url('sim')}/chat/completions", content=b"[1]")
    assert bad.status_code == 400 and "JSON object" in bad.json()["error"]["message"]
    missing = httpx.post(f"{server.url('nope')}/chat/completions", json={})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_a_full_engine_answers_429_not_a_failure(server: EngineServer) -> None:
    client = openai.OpenAI(base_url=server.url("one"), api_key="unused", max_retries=0)
    running = client.chat.completions.create(
        model=DEMO_MODEL, messages=HELLO, stream=True, max_tokens=500
    )
    next(iter(running))  # its one sequence is in the engine
    with pytest.raises(openai.RateLimitError) as err:
        client.chat.completions.create(model=DEMO_MODEL, messages=HELLO, max_tokens=5)
    assert err.value.code == "engine_overloaded"
    running.close()
    assert httpx.get(f"{server.url('one')}/health").status_code == 200


def test_reader_signals_on_the_store_reach_the_engine_running_the_request(
    redis_server: RedisServer, key_prefix: str
) -> None:
    config, _ = demo_config(backends=[])
    config = config.model_copy(
        update={
            "store": config.store.model_copy(
                update={"redis_url": redis_server.url, "key_prefix": key_prefix}
            )
        }
    )
    engine = EmbeddedEngine("sim", time_scale=0.2)  # a token every ~35 ms
    s = EngineServer([engine], config)
    s.start()
    publisher = redis.Redis.from_url(redis_server.url)
    try:
        client = openai.OpenAI(base_url=s.url("sim"), api_key="unused", max_retries=0)
        stream = client.chat.completions.create(
            model=DEMO_MODEL,
            messages=HELLO,
            stream=True,
            max_tokens=400,
            extra_body={"vllm_xargs": {"tp_request_id": "req-7"}},
        )
        next(iter(stream))
        table = engine.engine.table
        deadline = time.monotonic() + 5
        while "req-7/0" not in table and time.monotonic() < deadline:
            time.sleep(0.01)
        signal = ReaderSignal(Presence.AWAY, buffer_tokens=3)
        while time.monotonic() < deadline:  # until the engine server's subscription is live
            publisher.publish(channel(key_prefix), encode_wire("req-7", signal))
            time.sleep(0.05)
            if table.col("stated_buffer")[table.row("req-7/0")] == 3:
                break
        row = table.row("req-7/0")
        assert table.col("stated_buffer")[row] == 3
        assert table.col("away_until")[row] > engine.engine.clock
        stream.close()
    finally:
        publisher.close()
        s.stop()
