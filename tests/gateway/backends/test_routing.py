"""Routing, health checks, the in-process backend seam, metrics, OpenAPI and logs."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from typing import Any

import openai
import pytest

from gateway.backends import Backend, BackendError, InProcessBackend, aggregate_chunks
from gateway.backends.routing import Router
from gateway.config.loader import parse_config
from gateway.config.schema import BACKEND_KINDS, ConfigError
from gateway.telemetry.logs import JsonFormatter, RequestIdFilter, request_id_var
from tests.support.fake_upstream import MODEL, upstream
from tests.support.gateway import KEY, backend_entry, data_events, gateway, make_config, sse_lines
from tests.support.waiting import eventually

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}


# -- the router ---------------------------------------------------------------------


class _Dummy(Backend):
    def __init__(self, name: str, models=(MODEL,), tps: float | None = None) -> None:
        self.name, self.models, self.throughput_tps = name, tuple(models), tps

    async def open_stream(self, endpoint, body, ctx):  # pragma: no cover - not called
        raise NotImplementedError

    async def complete(self, endpoint, body, ctx):  # pragma: no cover - not called
        raise NotImplementedError


def _router(*backends: Backend) -> Router:
    return Router(list(backends), make_config([]))


def test_router_least_waiting_time():
    a, b, c = _Dummy("a"), _Dummy("b", tps=4000), _Dummy("c", models=("other",))
    router = _router(a, b, c)
    sa, sb, _ = router.states
    # idle: round robin over the candidates, in configuration order
    assert [router.choose(MODEL).name for _ in range(4)] == ["a", "b", "a", "b"]
    lease_a = router.acquire(sa, 1000)  # a: 1000 tokens at 1000 tok/s = 1 s
    lease_b = router.acquire(sb, 2000)  # b: 2000 tokens at 4000 tok/s = 0.5 s
    assert sb.waiting_time() == 0.5 and sa.waiting_time() == 1.0
    assert router.choose(MODEL).name == "b"
    lease_a.tokens(900)  # a's request streamed most of its tokens: 0.1 s left
    assert router.choose(MODEL).name == "a"
    lease_a.tokens(5000)  # never below zero
    assert sa.outstanding_tokens == 0
    lease_a.release()
    lease_a.release()  # idempotent
    lease_b.release()
    assert (sa.in_flight, sb.in_flight, sb.outstanding_tokens) == (0, 0, 0)
    assert router.choose("other").name == "c" and router.choose("nope") is None
    assert router.choose(MODEL, exclude={"a", "b"}) is None


def test_lease_moves_its_remaining_work_with_it():
    router = _router(_Dummy("a"), _Dummy("b"))
    sa, sb = router.states
    assert router.state("b") is sb
    lease = router.acquire(sa, 100)
    lease.tokens(30)
    lease.move(sb)  # a failover: the request's share of the work is on b now
    assert (sa.in_flight, sa.outstanding_tokens) == (0, 0)
    assert (sb.in_flight, sb.outstanding_tokens) == (1, 70)
    lease.release()
    lease.move(sa)  # released: nothing left to move
    assert (sa.in_flight, sa.outstanding_tokens, sb.in_flight, sb.outstanding_tokens) == (0,) * 4


def test_router_health_preference():
    router = _router(_Dummy("a"), _Dummy("b"))
    sa, sb = router.states
    sa.healthy = False
    assert {router.choose(MODEL).name for _ in range(3)} == {"b"}
    sb.healthy = False  # nothing healthy: still try something rather than refuse
    assert router.choose(MODEL) is not None
    assert not router.any_healthy()
    assert [card["id"] for card in router.model_cards()] == [MODEL]


# -- health checks --------------------------------------------------------------------


async def test_health_checks_in_background():
    async with upstream() as a, upstream() as b:
        config = make_config(
            [backend_entry(a, "a"), backend_entry(b, "b")],
            health={"interval_s": 0.05, "timeout_s": 0.5},
        )
        async with gateway(config) as gw, gw.client() as client:
            assert (await client.get("/readyz")).status_code == 200
            a.healthy = False
            states = gw.state.router.states
            assert await eventually(lambda: not states[0].healthy)
            for _ in range(4):  # requests avoid the unhealthy backend
                resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": False})
                assert resp.status_code == 200
            assert len(a.bodies) == 0 and len(b.bodies) == 4
            b.healthy = False
            assert await eventually(lambda: not states[1].healthy)
            ready = await client.get("/readyz")
            assert ready.status_code == 503
            assert ready.json() == {"status": "not ready", "backends": {"a": False, "b": False}}
            assert (await client.get("/healthz")).json() == {"status": "ok", "backends": None}
            metrics = (await client.get("/metrics")).text
            assert 'tokenpace_backend_healthy{backend="a"} 0.0' in metrics
            a.healthy = True
            assert await eventually(lambda: states[0].healthy)
            assert (await client.get("/readyz")).status_code == 200


# -- the in-process seam ------------------------------------------------------------


class EchoEngine(InProcessBackend):
    """A tiny in-process engine: streams the words of the last message back."""

    def __init__(self, name: str = "echo", delay: float = 0.0) -> None:
        super().__init__(name, ["echo-model"], tokenpace=True)
        self.delay = delay
        # each request's body and decided labels (not its context, which holds the
        # request's admission ticket: this engine outlives its test)
        self.seen: list[tuple[dict, tuple[str, str, bool]]] = []
        self.cancelled = 0
        self.started = False
        self.closed = False

    async def start(self, runtime) -> None:
        self.started = True

    async def aclose(self) -> None:
        self.closed = True

    async def admit(self, endpoint, body, ctx) -> None:
        if body["messages"][-1]["content"] == "refuse":
            raise BackendError("too long", status=400, retryable=False, code="context_length")
        if body["messages"][-1]["content"] == "queue forever":
            try:
                await asyncio.sleep(60)  # never admitted
            except asyncio.CancelledError:
                self.cancelled += 1
                raise

    async def generate(self, endpoint, body, ctx):
        self.seen.append((body, (ctx.tenant, ctx.tier.name, ctx.stream)))
        words = body["messages"][-1]["content"].split()
        usage = (body.get("stream_options") or {}).get("include_usage")
        base = {
            "id": "echo-1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": body["model"],
        }
        try:
            yield {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
            for w in words:
                await asyncio.sleep(self.delay)
                yield {**base, "choices": [{"index": 0, "delta": {"content": w + " "}}]}
            yield {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            if usage:
                u = {
                    "prompt_tokens": 1,
                    "completion_tokens": len(words),
                    "total_tokens": 1 + len(words),
                }
                yield {**base, "choices": [], "usage": u}
        except (GeneratorExit, asyncio.CancelledError):
            self.cancelled += 1
            raise


async def test_in_process_backend_seam():
    engine = EchoEngine(delay=0.002)
    config = make_config([])
    async with gateway(config, backends=[engine]) as gw:
        assert engine.started
        client = openai.AsyncOpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
        msgs = [{"role": "user", "content": "one two three"}]
        stream = await client.chat.completions.create(
            model="echo-model",
            messages=msgs,
            stream=True,
            extra_body={"tokenpace": {"tier": "voice"}},
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == "one two three "
        body, labels = engine.seen[-1]
        assert body["vllm_xargs"]["tp_tier"] == "voice" and "tokenpace" not in body
        assert labels == ("acme", "voice", True)
        # non-streaming comes from the same generator, aggregated
        done = await client.chat.completions.create(model="echo-model", messages=msgs)
        assert done.choices[0].message.content == "one two three "
        assert done.usage.completion_tokens == 3 and done.choices[0].finish_reason == "stop"
        # a refusal before the first chunk is a plain HTTP error
        with pytest.raises(openai.BadRequestError) as err:
            await client.chat.completions.create(
                model="echo-model", messages=[{"role": "user", "content": "refuse"}], stream=True
            )
        assert err.value.code == "context_length"
        await client.close()
        # a client that goes away cancels the generator
        engine.delay = 0.05
        long = {
            "model": "echo-model",
            "messages": [{"role": "user", "content": "w " * 200}],
            "stream": True,
        }
        async with (
            gw.client() as http,
            http.stream("POST", "/v1/chat/completions", json=long) as resp,
        ):
            async for line in resp.aiter_lines():
                if "w " in line:
                    break
        assert await eventually(lambda: engine.cancelled == 1)
        # ... also while it waits to be admitted, before any response byte
        queued = {**long, "messages": [{"role": "user", "content": "queue forever"}]}
        async with gw.client() as http:
            task = asyncio.create_task(http.post("/v1/chat/completions", json=queued))
            state = gw.state.router.states[0]
            assert await eventually(lambda: state.in_flight == 1)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert await eventually(lambda: engine.cancelled == 2, timeout=1.0)
        assert await eventually(lambda: state.in_flight == 0 and state.outstanding_tokens == 0)
    assert engine.closed


def test_backend_kinds_are_one_table_whatever_was_imported():
    """Config validation knows every kind without importing the backends; the table in
    gateway.backends.kinds builds each kind the configuration accepts."""
    from gateway.app import create_app
    from gateway.backends.embedded import EmbeddedEngine
    from gateway.backends.kinds import KINDS

    assert set(KINDS) == set(BACKEND_KINDS)
    check = (
        "import sys; from gateway.config.schema import ConfigError\n"
        "from gateway.config.loader import parse_config\n"
        "base = {'tenants': [{'name': 't', 'api_keys': ['tp-kind-key-1']}]}\n"
        "parse_config({**base, 'backends': [{'name': 'e', 'kind': 'embedded', 'models': ['m']}]})\n"
        "try:\n"
        "    parse_config({**base, 'backends': [{'name': 'w', 'kind': 'warp', 'models': ['m']}]})\n"
        "except ConfigError as exc:\n"
        "    assert \"unknown backend kind 'warp'\" in str(exc), exc\n"
        "else:\n"
        "    raise SystemExit('warp accepted')\n"
        "assert 'gateway.backends' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", check], check=True, timeout=60)
    tenants = [{"name": "t", "api_keys": ["tp-kind-key-1"]}]
    embedded = {"name": "e", "kind": "embedded", "models": ["m"], "options": {"time_scale": 2.0}}
    config = parse_config({"tenants": tenants, "backends": [embedded]})
    (backend,) = create_app(config).state.gateway.backends
    assert isinstance(backend, EmbeddedEngine) and backend.options.time_scale == 2.0
    with pytest.raises(ConfigError, match="unknown backend kind 'echo'"):
        parse_config({"tenants": tenants, "backends": [{**embedded, "kind": "echo"}]})


def test_aggregate_tool_calls_and_completions():
    chunks = [
        {
            "id": "x",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": {"role": "assistant"}}],
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{"},
                            }
                        ]
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]},
                    "finish_reason": "tool_calls",
                }
            ]
        },
    ]
    out = aggregate_chunks("chat.completions", chunks)
    call = out["choices"][0]["message"]["tool_calls"][0]
    assert call == {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert out["choices"][0]["finish_reason"] == "tool_calls" and out["object"] == "chat.completion"
    text = aggregate_chunks(
        "completions",
        [
            {"choices": [{"index": 0, "text": "a"}]},
            {"choices": [{"index": 0, "text": "b", "finish_reason": "stop"}]},
        ],
    )
    assert text["choices"][0]["text"] == "ab" and text["object"] == "text_completion"


# -- metrics ------------------------------------------------------------------------


def _sample(metrics: str, name: str, **labels: str) -> float | None:
    for line in metrics.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_metrics():
    async with (
        upstream(n_tokens=12, token_interval=0.01) as fake,
        gateway(make_config([backend_entry(fake, "a", tokenpace=True)])) as gw,
        gw.client() as client,
    ):
        for tier in ("voice", "fast"):
            _, lines = await _stream(client, {**CHAT, "tokenpace": {"tier": tier}})
            assert data_events(lines)[-1] == "[DONE]"
        await client.post("/v1/chat/completions", json={**CHAT, "stream": False})
        await client.post("/v1/chat/completions", json={"model": MODEL})  # 400
        text = (await client.get("/metrics")).text

    ok = {"tenant": "acme", "backend": "a", "endpoint": "chat.completions", "status": "200"}
    assert _sample(text, "tokenpace_requests_total", tier="voice", outcome="completed", **ok) == 1
    assert _sample(text, "tokenpace_requests_total", tier="chat", outcome="completed", **ok) == 1
    bad = {"tenant": "acme", "tier": "-", "status": "400", "outcome": "error"}
    assert _sample(text, "tokenpace_requests_total", **bad) == 1
    voice_a = {"tier": "voice", "backend": "a"}
    assert _sample(text, "tokenpace_ttft_seconds_count", tenant="acme", **voice_a) == 1
    assert _sample(text, "tokenpace_inter_token_seconds_count", **voice_a) == 11
    for metric in ("andes", "monotone"):
        count = _sample(text, "tokenpace_qoe_count", tier="voice", metric=metric)
        total = _sample(text, "tokenpace_qoe_sum", tier="voice", metric=metric)
        assert count == 1 and 0.0 < total <= 1.0
    # 12 tokens in ~0.15 s: well ahead of the voice timeline, full QoE
    assert _sample(text, "tokenpace_qoe_sum", tier="voice", metric="andes") == 1.0
    assert _sample(text, "tokenpace_output_tokens_total", **voice_a) == 12
    assert _sample(text, "tokenpace_output_tokens_total", tier="chat", backend="a") == 12
    assert _sample(text, "tokenpace_requests_in_flight", endpoint="chat.completions") == 0
    assert _sample(text, "tokenpace_backend_in_flight", backend="a") == 0
    assert _sample(text, "tokenpace_backend_outstanding_tokens", backend="a") == 0


@pytest.mark.parametrize("continuous", [False, True])
async def test_several_tokens_per_chunk_counted_from_running_usage(monkeypatch, continuous):
    """vLLM --stream-interval 4: a chunk carries up to 4 tokens. With continuous usage
    stats the gateway's timeline counts each chunk's tokens from the running count;
    without, one per chunk (all it can tell), and the final usage still gives the total."""
    from gateway.relay import streaming

    captured: list[Any] = []
    original = streaming.StreamRelay.finish

    async def spy(self):
        captured.append(list(self.counts))
        return await original(self)

    monkeypatch.setattr(streaming.StreamRelay, "finish", spy)
    options = {"include_usage": True, "continuous_usage_stats": continuous}
    async with (
        upstream(n_tokens=10, tokens_per_chunk=4) as fake,
        gateway(make_config([backend_entry(fake, "a")])) as gw,
        gw.client() as client,
    ):
        await _stream(client, {**CHAT, "stream_options": options})
        text = (await client.get("/metrics")).text
    assert captured[0] == ([4, 4, 2] if continuous else [1, 1, 1])
    assert _sample(text, "tokenpace_output_tokens_total", backend="a") == 10


async def test_gateway_qoe_matches_qos_metrics(monkeypatch):
    """The QoE the gateway records is qos.metrics' on the gateway's own emission times."""
    from gateway.relay import streaming
    from qos.metrics import andes_qoe, monotone_qoe

    captured: list[Any] = []
    original = streaming.StreamRelay.finish

    async def spy(self):
        captured.append((list(self.times), list(self.counts), self.ctx.tier))
        return await original(self)

    monkeypatch.setattr(streaming.StreamRelay, "finish", spy)
    # slower than the expected 100 tok/s after 0.02 s: QoE below 1
    async with (
        upstream(n_tokens=8, token_interval=0.03) as fake,
        gateway(make_config([backend_entry(fake, "a")])) as gw,
        gw.client() as client,
    ):
        await _stream(client, {**CHAT, "tokenpace": {"ttft": 0.02, "tds": 100}})
        text = (await client.get("/metrics")).text
    times, counts, tier = captured[0]
    timeline = list(zip(times, counts, strict=True))
    andes = andes_qoe(timeline, tier.ttft, tier.tds)
    mono = monotone_qoe(timeline, tier.ttft, tier.tds)
    assert andes < 1.0 and mono < 1.0
    assert (tier.name, tier.ttft, tier.tds) == ("custom", 0.02, 100.0)
    custom = {"tier": "custom"}
    assert _sample(text, "tokenpace_qoe_sum", metric="andes", **custom) == pytest.approx(andes)
    assert _sample(text, "tokenpace_qoe_sum", metric="monotone", **custom) == pytest.approx(mono)


async def _stream(client, body):
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        return resp, await sse_lines(resp)


# -- OpenAPI --------------------------------------------------------------------------


async def test_openapi_document_matches_behaviour():
    async with gateway(make_config([]), backends=[EchoEngine()]) as gw, gw.client(key="") as client:
        doc = (await client.get("/openapi.json")).json()
    paths = doc["paths"]
    assert set(paths) >= {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/healthz",
        "/readyz",
        "/metrics",
    }
    chat = paths["/v1/chat/completions"]["post"]
    ref = chat["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert {"model", "messages"} <= set(schema["required"])
    assert schema.get("additionalProperties", True) is True  # other fields pass through
    assert {"tokenpace", "stream_options", "max_tokens", "tools"} <= set(schema["properties"])
    responses = chat["responses"]
    assert {"200", "400", "401", "403", "404", "413", "502", "503"} <= set(responses)
    assert "422" not in responses and "HTTPValidationError" not in doc["components"]["schemas"]
    assert "text/event-stream" in responses["200"]["content"]
    assert {"X-Request-Id", "X-TokenPace-Tier", "X-TokenPace-TTFT", "X-TokenPace-TDS"} <= set(
        responses["200"]["headers"]
    )
    assert responses["400"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ErrorResponse"
    )
    params = {p["name"] for p in chat.get("parameters", [])}
    assert "X-TokenPace-Tier" in params
    assert chat["security"] and "TenantKey" in doc["components"]["securitySchemes"]
    assert paths["/readyz"]["get"]["responses"].keys() >= {"200", "503"}
    completions = paths["/v1/completions"]["post"]["requestBody"]["content"]["application/json"][
        "schema"
    ]["$ref"]
    assert "prompt" in doc["components"]["schemas"][completions.rsplit("/", 1)[1]]["required"]


# -- logs ---------------------------------------------------------------------------


async def test_access_log_carries_request_id(caplog):
    caplog.set_level(logging.INFO, logger="tokenpace")
    async with gateway(make_config([]), backends=[EchoEngine()]) as gw, gw.client() as client:
        resp = await client.post(
            "/v1/chat/completions",
            json={"model": "echo-model", "messages": [{"role": "user", "content": "a b"}]},
        )
    rid = resp.headers["x-request-id"]
    records = [r for r in caplog.records if r.name == "tokenpace.gateway.access"]
    record = next(r for r in records if getattr(r, "request_id", None) == rid)
    assert (record.tenant, record.tier, record.backend, record.status) == (
        "acme",
        "chat",
        "echo",
        200,
    )
    line = json.loads(JsonFormatter().format(record))
    assert line["request_id"] == rid and line["msg"] == "request finished" and line["status"] == 200


def test_request_id_filter():
    record = logging.LogRecord("tokenpace.x", logging.INFO, __file__, 1, "hello %s", ("w",), None)
    token = request_id_var.set("abc123")
    try:
        RequestIdFilter().filter(record)
    finally:
        request_id_var.reset(token)
    assert json.loads(JsonFormatter().format(record))["request_id"] == "abc123"
