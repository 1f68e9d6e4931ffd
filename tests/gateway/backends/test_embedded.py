"""The embedded SIMULATED engine (gateway/backends/embedded.py) behind the gateway.

Every request goes through the official openai client (or plain HTTP) to a real
uvicorn server in the test's event loop, whose backends are built from configuration
(``kind: embedded``), so the kind's registration on import is exercised too. The
engine is qos.sim with the Andes policy: no model runs, the text is placeholder.
Outputs are kept short (tens of tokens at ~5 ms per simulated iteration).
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import pytest_asyncio

from gateway.backends import BackendError
from gateway.backends.embedded import OWNED_BY, EmbeddedEngine
from gateway.backends.kinds import build_backends
from gateway.cli import check_config
from gateway.config.schema import DEMO_MODEL, ConfigError
from gateway.context import RequestContext, ResolvedTier
from qos.policy.andes import Andes
from qos.prompt_tokens import estimate_text_tokens
from tests.support.gateway import KEY, gateway, make_config
from tests.support.ports import free_port
from tests.support.waiting import eventually

SMALL = "tokenpace-sim-small"
HELLO = [{"role": "user", "content": "Hello!"}]

pytestmark = pytest.mark.asyncio(loop_scope="module")


def _config():
    return make_config(
        [
            {"name": "sim", "kind": "embedded", "models": [DEMO_MODEL]},
            {
                "name": "small",
                "kind": "embedded",
                "models": [SMALL],
                "options": {
                    "profile": "opt-66b-4xa100",
                    "time_scale": 10,
                    "kv_tokens": 512,
                    "max_sequences": 2,
                    "default_output_tokens": [4, 12],
                },
            },
        ]
    )


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def shared():
    async with gateway(_config()) as gw:
        client = openai.AsyncOpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
        yield gw, client
        await client.close()


def _engine(gw, name: str = "sim") -> EmbeddedEngine:
    backend = next(b for b in gw.state.backends if b.name == name)
    assert isinstance(backend, EmbeddedEngine)
    return backend


def _idle(engine: EmbeddedEngine) -> bool:
    """Nothing left of any request: no engine work, no table row, no route."""
    e = engine.engine
    return not e.has_work() and e.table.n == 0 and engine.stats()["sequences"] == 0


async def _stream_chat(client, **kwargs):
    stream = await client.chat.completions.create(
        model=DEMO_MODEL, messages=HELLO, stream=True, **kwargs
    )
    return [chunk async for chunk in stream]


def _content(chunks, index: int = 0) -> list[str]:
    return [
        c.choices[0].delta.content
        for c in chunks
        if c.choices and c.choices[0].index == index and c.choices[0].delta.content
    ]


# -- the protocol ---------------------------------------------------------------------


async def test_streaming_chat_exact_tokens_usage_and_shapes(shared):
    gw, client = shared
    engine = _engine(gw)
    assert isinstance(engine.engine.policy, Andes)
    started = time.monotonic()
    chunks = await _stream_chat(client, max_tokens=7, stream_options={"include_usage": True})
    elapsed = time.monotonic() - started
    assert all(c.object == "chat.completion.chunk" and c.model == DEMO_MODEL for c in chunks)
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    assert chunks[0].choices[0].delta.role == "assistant"
    tokens = _content(chunks)
    assert len(tokens) == 7  # one chunk per token, exactly max_tokens
    assert "".join(tokens).startswith("Simulated reply:")
    assert chunks[-2].choices[0].finish_reason == "length"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == 7
    assert usage.prompt_tokens == estimate_text_tokens("Hello!")
    assert usage.total_tokens == usage.prompt_tokens + 7
    assert all(c.usage is None for c in chunks[:-1])
    # paced by the simulation: 7 iterations take at least 7 decode times of the profile
    assert elapsed >= 7 * float(engine.profile.decode_s(1)) * 0.9
    assert await eventually(lambda: _idle(engine))


async def test_non_streaming_chat_is_the_same_text(shared):
    _gw, client = shared
    streamed = "".join(_content(await _stream_chat(client, max_tokens=12)))
    done = await client.chat.completions.create(model=DEMO_MODEL, messages=HELLO, max_tokens=12)
    assert done.object == "chat.completion" and done.choices[0].message.role == "assistant"
    assert done.choices[0].message.content == streamed  # deterministic: same prompt, same text
    assert done.choices[0].finish_reason == "length"
    assert done.usage.completion_tokens == 12
    again = await client.chat.completions.create(
        model=DEMO_MODEL, messages=HELLO, max_completion_tokens=12
    )
    assert again.choices[0].message.content == streamed
    other = await client.chat.completions.create(
        model=DEMO_MODEL, messages=[{"role": "user", "content": "Bye!"}], max_tokens=12
    )
    assert other.choices[0].message.content != streamed
    assert other.choices[0].message.content.startswith("Simulated reply:")


async def test_completions_streaming_and_default_length(shared):
    _gw, client = shared
    stream = await client.completions.create(
        model=DEMO_MODEL,
        prompt="Once upon a time",
        max_tokens=9,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert all(c.object == "text_completion" for c in chunks)
    texts = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
    assert len(texts) == 9
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 9
    assert chunks[-1].usage.prompt_tokens == estimate_text_tokens("Once upon a time")
    # without max_tokens: OpenAI's default of 16 for completions
    done = await client.completions.create(model=DEMO_MODEL, prompt="Once upon a time")
    assert done.usage.completion_tokens == 16 and done.choices[0].finish_reason == "length"
    assert done.choices[0].text.startswith("".join(texts))


async def test_chat_without_max_tokens_ends_naturally(shared):
    _gw, client = shared
    first = await client.chat.completions.create(model=SMALL, messages=HELLO)
    second = await client.chat.completions.create(model=SMALL, messages=HELLO)
    assert first.choices[0].finish_reason == "stop"
    assert 4 <= first.usage.completion_tokens <= 12  # default_output_tokens
    assert second.choices[0].message.content == first.choices[0].message.content


async def test_stop_strings(shared):
    gw, client = shared
    full = await client.chat.completions.create(model=DEMO_MODEL, messages=HELLO, max_tokens=20)
    text = full.choices[0].message.content
    # "ed rep" spans the first two tokens ("Simulated", " reply"): held back, then cut
    chunks = await _stream_chat(client, max_tokens=20, stop=["ed rep"])
    assert "".join(_content(chunks)) == "Simulat"
    assert chunks[-1].choices[0].finish_reason == "stop"
    # a later stop string, non-streaming: the text up to it, fewer tokens generated
    stop = text[30:36]
    cut = await client.chat.completions.create(
        model=DEMO_MODEL, messages=HELLO, max_tokens=20, stop=stop
    )
    assert cut.choices[0].message.content == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens < 20
    unmatched = await client.chat.completions.create(
        model=DEMO_MODEL, messages=HELLO, max_tokens=20, stop=["\n\n"]
    )
    assert unmatched.choices[0].message.content == text
    assert await eventually(lambda: _idle(_engine(gw)))  # the stopped sequence left the engine


async def test_several_choices(shared):
    _gw, client = shared
    chunks = await _stream_chat(client, max_tokens=5, n=2, stream_options={"include_usage": True})
    a, b = _content(chunks, 0), _content(chunks, 1)
    assert len(a) == len(b) == 5 and a != b
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes.count("length") == 2
    assert chunks[-1].usage.completion_tokens == 10


async def test_models_say_simulation(shared):
    _gw, client = shared
    models = await client.models.list()
    by_id = {m.id: m for m in models.data}
    assert set(by_id) == {DEMO_MODEL, SMALL}
    sim = by_id[DEMO_MODEL]
    assert sim.object == "model" and sim.owned_by == OWNED_BY
    assert "SIMULATION" in sim.model_extra["description"]
    assert "llama-3.1-8b-h100" in sim.model_extra["description"]


# -- batching, disconnects, refusals ------------------------------------------------


async def test_concurrent_streams_are_batched(shared):
    gw, client = shared
    engine = _engine(gw)
    iterations_before = engine.iterations
    n_streams, n_tokens = 16, 100
    times: list[list[float]] = [[] for _ in range(n_streams)]

    async def one(i: int) -> None:
        stream = await client.chat.completions.create(
            model=DEMO_MODEL,
            messages=[{"role": "user", "content": f"stream {i}"}],
            max_tokens=n_tokens,
            stream=True,
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                times[i].append(time.monotonic())

    await asyncio.gather(*(one(i) for i in range(n_streams)))
    assert all(len(t) == n_tokens for t in times)
    iterations = engine.iterations - iterations_before
    # one token per sequence per iteration: batched streams share iterations
    assert iterations < n_streams * n_tokens / 2, iterations
    assert engine.peak_batch > 1
    # and the streams overlap in time: every stream starts before the first one ends
    assert max(t[0] for t in times) < min(t[-1] for t in times)
    assert await eventually(lambda: _idle(engine))


async def test_client_disconnect_aborts_the_engine_request(shared):
    gw, client = shared
    engine = _engine(gw)
    await _stream_chat(client, max_tokens=2)  # warm up the server's long-lived tasks
    await asyncio.sleep(0.05)
    gc.collect()
    before = {t for t in asyncio.all_tasks() if not t.done()}

    stream = await client.chat.completions.create(
        model=DEMO_MODEL,
        messages=HELLO,
        max_tokens=4000,  # ~20 s of simulated decoding
        stream=True,
        extra_headers={"X-TokenPace-Tier": "voice"},
    )
    got = 0
    async for chunk in stream:
        got += bool(chunk.choices and chunk.choices[0].delta.content)
        if got == 3:
            break
    table = engine.engine.table
    assert table.n == 1  # the tier, tenant and weight reached the engine's table
    assert float(table.col("tds")[0]) == 3.3 and float(table.col("weight")[0]) == 2.0
    assert table.tenant_names[int(table.col("tenant")[0])] == "acme"
    await stream.close()
    assert await eventually(lambda: _idle(engine), timeout=1.0)

    # non-streaming: the client gives up waiting, the engine drops the request
    iterations = engine.iterations
    async with gw.client() as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post(
                "/v1/chat/completions",
                json={"model": DEMO_MODEL, "messages": HELLO, "max_tokens": 4000},
                timeout=0.3,
            )
    assert engine.iterations > iterations  # it was being generated
    assert await eventually(lambda: _idle(engine), timeout=1.0)

    def settled() -> bool:
        return not {t for t in asyncio.all_tasks() if not t.done()} - before

    assert await eventually(settled, timeout=2.0), [
        t.get_name() for t in asyncio.all_tasks() - before
    ]


async def test_refusals_are_openai_errors(shared):
    _gw, client = shared
    with pytest.raises(openai.BadRequestError) as err:  # more than the 512-token KV cache
        await client.chat.completions.create(model=SMALL, messages=HELLO, max_tokens=600)
    assert err.value.code == "context_length_exceeded" and err.value.param == "messages"
    with pytest.raises(openai.InternalServerError) as full:  # 3 sequences, room for 2
        await client.chat.completions.create(model=SMALL, messages=HELLO, max_tokens=2, n=3)
    assert full.value.status_code == 503 and full.value.code == "engine_overloaded"


async def test_time_scale_speeds_the_simulation_up(shared):
    gw, client = shared
    small = _engine(gw, "small")  # opt-66b: 40 ms per token at batch 1, run 10x faster
    started = time.monotonic()
    done = await client.chat.completions.create(model=SMALL, messages=HELLO, max_tokens=20)
    elapsed = time.monotonic() - started
    assert done.usage.completion_tokens == 20
    unscaled = 20 * float(small.profile.decode_s(1))  # 0.8 s: the profile's own pace
    assert unscaled / 10 * 0.9 <= elapsed < unscaled


# -- the engine on its own ------------------------------------------------------------


def _ctx(request_id: str) -> RequestContext:
    return RequestContext(
        request_id=request_id,
        tenant="t",
        weight=1.0,
        tier=ResolvedTier("chat", 1.0, 4.8, 1),
        endpoint="chat.completions",
        model=DEMO_MODEL,
        stream=True,
        received_at=time.monotonic(),
        expected_tokens=10,
    )


async def test_shutdown_ends_live_streams_and_the_engine_task():
    engine = EmbeddedEngine()
    body = {"model": DEMO_MODEL, "messages": HELLO, "max_tokens": 4000, "stream": True}
    with pytest.raises(BackendError) as err:  # not started: refused before any stream
        await engine.open_stream("chat.completions", body, _ctx("a"))
    assert err.value.status == 503 and err.value.retryable
    await engine.start(None)  # type: ignore[arg-type] - the runtime is not used
    assert await engine.check_health()
    stream = await engine.open_stream("chat.completions", body, _ctx("b"))
    [first] = (await stream.next_batch()).chunks
    assert first["choices"][0]["delta"]["role"] == "assistant"
    await engine.aclose()
    assert not await engine.check_health()
    with pytest.raises(BackendError, match="shut down"):
        while True:
            await stream.next_batch()
    await stream.aclose()
    assert _idle(engine)
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "tokenpace-embedded-embedded"]


async def test_overdue_options_reach_the_reader_guard():
    guard = EmbeddedEngine().engine.policy.guard
    assert (guard.settings.overdue_after_ttfts, guard.settings.overdue_after_fcfs_waits) == (
        10.0,
        1.25,
    )
    options = {"overdue_after_ttfts": 30, "overdue_after_fcfs_waits": 0}
    guard = EmbeddedEngine(**options).engine.policy.guard
    assert (guard.settings.overdue_after_ttfts, guard.settings.overdue_after_fcfs_waits) == (
        30.0,
        0.0,
    )


async def test_bad_options_name_the_key(tmp_path: Path):
    entry = {"name": "sim", "kind": "embedded", "models": [DEMO_MODEL]}
    for options, where in (
        ({"profile": "gpt-9"}, "backends[sim].options.profile: unknown latency profile"),
        ({"polcy": "andes"}, "backends[sim].options.polcy: unknown key"),
        ({"kv_tokens": 8}, "backends[sim].options: kv_tokens"),
        ({"overdue_after_fcfs_waits": -1}, "backends[sim].options.overdue_after_fcfs_waits"),
        (
            {"policy": "fcfs", "overdue_after_ttfts": 30},
            "backends[sim].options: overdue_after_ttfts: the reader guard's settings",
        ),
        (
            {"policy": "fcfs", "fair_share_slack": 64},
            "backends[sim].options: fair_share_slack: policy 'fcfs' reads no settings",
        ),
    ):
        with pytest.raises(ConfigError) as err:
            build_backends(make_config([{**entry, "options": options}]))
        assert where in str(err.value)
    path = tmp_path / "gw.yaml"
    path.write_text(
        "tenants: [{name: a, api_keys: [tp-key-000000001]}]\n"
        "backends: [{name: sim, kind: embedded, models: [m], options: {policy: lifo}}]\n"
    )
    assert check_config([str(path)]) == 1


# -- `tokenpace serve` without a configuration ----------------------------------------


async def test_serve_without_config_starts_the_demo():
    port = free_port()
    env = {
        k: v for k, v in os.environ.items() if k not in ("TOKENPACE_CONFIG", "TOKENPACE_DEMO_KEY")
    }
    script = Path(sys.executable).with_name("tokenpace")
    proc = await asyncio.create_subprocess_exec(
        str(script),
        "serve",
        "--port",
        str(port),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        banner = ""
        while "flush=True)" not in banner:  # the banner's last line
            line = await asyncio.wait_for(proc.stdout.readline(), 20)
            assert line, f"serve exited early: {banner}"
            banner += line.decode()
        key = re.search(r"API key: (\S+)", banner).group(1)
        assert f"http://127.0.0.1:{port}" in banner and "SIMULATED" in banner
        assert "curl -N" in banner and "from openai import OpenAI" in banner
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:

            async def ready() -> bool:
                try:
                    return (await http.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            deadline = time.monotonic() + 20
            while not await ready():
                assert time.monotonic() < deadline, "the gateway did not become ready"
                await asyncio.sleep(0.1)
            body = {"model": DEMO_MODEL, "messages": HELLO, "stream": True, "max_tokens": 5}
            headers = {"Authorization": f"Bearer {key}", "X-TokenPace-Tier": "chat"}
            async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status_code == 200
                lines = [line async for line in r.aiter_lines() if line.startswith("data:")]
            assert lines[-1] == "data: [DONE]" and len(lines) == 1 + 5 + 1 + 1  # role, 5, end
    finally:
        proc.terminate()
        _out, err = await asyncio.wait_for(proc.communicate(), 10)
    assert "SIMULATION" in err.decode()  # the warning at start
