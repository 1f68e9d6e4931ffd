"""OpenTelemetry traces: the span tree of a request (a failover included) and its
attributes, ``traceparent`` at the upstream, the client's trace continued, the OTLP
exporter configured by the standard variables, and nothing at all when off.

The gateway runs on a real uvicorn in front of FakeUpstream stand-ins for vLLM (which
record the headers they receive); spans are read from the SDK's in-memory exporter, or,
for the OTLP test, from a local collector stand-in that decodes what the real exporter
sends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.app import create_app
from gateway.telemetry.tracing import TRACING_OFF, Tracing, tracing_wanted
from tests.support.asgi import read_body, serve_lifespan
from tests.support.fake_upstream import MODEL, FakeUpstream, upstream
from tests.support.gateway import KEY, Gateway, backend_entry, make_config
from tests.support.servers import run_server
from tests.support.waiting import eventually

MESSAGES = [{"role": "user", "content": "Hello!"}]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@asynccontextmanager
async def traced_gateway(
    fakes: dict[str, FakeUpstream], tracing: Tracing
) -> AsyncIterator[Gateway]:
    """A gateway in front of ``fakes`` (in that order: the first is tried first)."""
    config = make_config(  # least_waiting: a fresh gateway tries the first backend first
        [backend_entry(fake, name) for name, fake in fakes.items()],
        routing={"policy": "least_waiting"},
    )
    app = create_app(config, tracing=tracing)
    async with run_server(app, config) as url:
        yield Gateway(url, app)


def in_memory() -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider), exporter


def children(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    found = [
        s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id
    ]
    return sorted(found, key=lambda s: s.start_time or 0)


def server_span(spans: Sequence[ReadableSpan]) -> ReadableSpan:
    (found,) = [s for s in spans if s.kind is SpanKind.SERVER]
    return found


async def stream_text(gw: Gateway, **extra: Any) -> str:
    async with openai.AsyncOpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0) as client:
        chunks = await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, stream=True, max_tokens=6, **extra
        )
        return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])


async def test_a_stream_with_a_failover_is_one_tree_of_spans() -> None:
    tracing, exporter = in_memory()
    async with (
        upstream() as bad,
        upstream(n_tokens=6, token_interval=0.01) as good,
        traced_gateway({"bad": bad, "good": good}, tracing) as gw,
    ):
        bad.mode = "http_500"
        exporter.clear()  # start-up's health checks would be here, if any were traced
        assert await stream_text(gw) == "".join(f"t{i} " for i in range(6))
        assert await eventually(
            lambda: any(s.kind is SpanKind.SERVER for s in exporter.get_finished_spans())
        )
        spans = exporter.get_finished_spans()

    request = server_span(spans)
    assert request.name == "POST /v1/chat/completions" and request.parent is None
    assert {s.context.trace_id for s in spans} == {request.context.trace_id}  # one trace
    names = [s.name for s in children(spans, request)]
    assert names == [
        "tokenpace.authenticate",
        "tokenpace.admission",
        "tokenpace.backend_attempt",
        "tokenpace.backend_attempt",
        "tokenpace.stream",
    ]
    _auth, _admission, failed, served, stream = children(spans, request)
    # the failover: the first attempt failed before a byte reached the client
    assert dict(failed.attributes or {}) == {
        "tokenpace.backend": "bad",
        "tokenpace.attempt": 0,
        "tokenpace.failover": True,
        "error.type": "upstream_error",
    }
    assert failed.status.status_code is StatusCode.ERROR and "500" in (
        failed.status.description or ""
    )
    assert served.attributes == {"tokenpace.backend": "good", "tokenpace.attempt": 1}
    assert served.status.status_code is StatusCode.UNSET
    for attempt in (failed, served):  # each attempt's HTTP request, httpx's client span
        (http,) = children(spans, attempt)
        assert http.kind is SpanKind.CLIENT and http.name == "POST"
    assert served.end_time is not None and stream.end_time is not None
    assert served.end_time <= stream.end_time  # the attempt lasts until its stream closes

    attributes = dict(request.attributes or {})
    for key, value in {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": MODEL,
        "gen_ai.request.max_tokens": 6,
        "gen_ai.usage.output_tokens": 6,
        "tokenpace.tenant": "acme",
        "tokenpace.tier": "chat",
        "tokenpace.tier.ttft_s": 1.0,
        "tokenpace.tier.tds": 4.8,
        "tokenpace.stream": True,
        "tokenpace.backend": "good",
        "tokenpace.outcome": "completed",
    }.items():
        assert attributes[key] == value, key
    assert 0.0 < attributes["tokenpace.qoe.andes"] <= 1.0
    assert 0.0 < attributes["tokenpace.qoe.monotone"] <= 1.0
    assert 0.0 < attributes["tokenpace.ttft_s"] < 5.0
    # 6 tokens 10 ms apart, read at 4.8 tokens/s: the reader never waits
    assert attributes["tokenpace.freeze.longest_s"] == 0.0
    assert dict(stream.attributes or {})["tokenpace.qoe.andes"] == attributes["tokenpace.qoe.andes"]


async def test_traceparent_reaches_the_upstream_and_the_client_trace_goes_on() -> None:
    tracing, exporter = in_memory()
    async with (
        upstream() as up,
        traced_gateway({"up": up}, tracing) as gw,
        gw.client() as client,
    ):
        incoming = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 3}
        r = await client.post("/v1/chat/completions", json=body, headers={"traceparent": incoming})
        assert r.status_code == 200
        assert await eventually(
            lambda: any(s.kind is SpanKind.SERVER for s in exporter.get_finished_spans())
        )
        spans = exporter.get_finished_spans()
        sent = up.headers[-1]["traceparent"]

    request = server_span(spans)
    assert format(request.context.trace_id, "032x") == TRACE_ID  # the client's trace
    assert request.parent is not None and request.parent.span_id == 0x00F067AA0BA902B7
    (attempt,) = [s for s in children(spans, request) if s.name == "tokenpace.backend_attempt"]
    (http,) = children(spans, attempt)
    version, trace_id, parent_id, flags = sent.split("-")
    assert (version, trace_id, flags) == ("00", TRACE_ID, "01")
    assert int(parent_id, 16) == http.context.span_id  # vLLM's spans join under it
    # a whole (non-streaming) response: its usage on the request's span
    attributes = dict(request.attributes or {})
    assert attributes["gen_ai.usage.output_tokens"] == 3
    assert attributes["tokenpace.stream"] is False
    # health checks and the other background requests are not traced
    assert all(s.parent is not None for s in spans if s.kind is SpanKind.CLIENT)


async def test_a_refused_key_is_an_authentication_span_in_error() -> None:
    tracing, exporter = in_memory()
    async with upstream() as up, traced_gateway({"up": up}, tracing) as gw:
        async with gw.client(key="tp-not-a-key-000") as client:
            r = await client.post(
                "/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES}
            )
        assert r.status_code == 401
        assert await eventually(
            lambda: any(s.kind is SpanKind.SERVER for s in exporter.get_finished_spans())
        )
        spans = exporter.get_finished_spans()
    (auth,) = children(spans, server_span(spans))
    assert auth.name == "tokenpace.authenticate" and auth.status.status_code is StatusCode.ERROR


async def test_off_there_are_no_spans_and_no_traceparent() -> None:
    assert not TRACING_OFF.on
    async with upstream() as up, traced_gateway({"up": up}, TRACING_OFF) as gw:
        assert await stream_text(gw) == "".join(f"t{i} " for i in range(6))
        assert "traceparent" not in up.headers[-1]
        app = gw.app
        assert not getattr(app, "_is_instrumented_by_opentelemetry", False)


@pytest.mark.parametrize(
    ("environ", "wanted"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_SERVICE_NAME": "gw"}, False),
    ],
)
def test_the_standard_variables_turn_tracing_on(environ: dict[str, str], wanted: bool) -> None:
    assert tracing_wanted(environ) is wanted
    if not wanted:
        assert Tracing.from_environment(environ) is TRACING_OFF


class Collector:
    """A stand-in for an OpenTelemetry collector's OTLP/HTTP receiver: keeps every
    ``POST /v1/traces`` body, decoded with OpenTelemetry's own protobuf classes."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        body = await read_body(receive)
        if scope["path"] == "/v1/traces":
            self.requests.append(ExportTraceServiceRequest.FromString(body))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def test_spans_are_exported_over_otlp(monkeypatch: pytest.MonkeyPatch) -> None:
    collector = Collector()
    async with run_server(collector) as collector_url, upstream() as up:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector_url)
        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
        monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
        tracing = Tracing.from_environment()
        assert tracing.on
        async with traced_gateway({"up": up}, tracing) as gw:
            await stream_text(gw)
        await asyncio.to_thread(tracing.shutdown)  # flushes the batch (to this loop's server)
        assert collector.requests

    names: set[str] = set()
    services: set[str] = set()
    for request in collector.requests:
        for resource_spans in request.resource_spans:
            for kv in resource_spans.resource.attributes:
                if kv.key == "service.name":
                    services.add(kv.value.string_value)
            for scope_spans in resource_spans.scope_spans:
                names.update(span.name for span in scope_spans.spans)
    assert services == {"tokenpace-gateway"}
    assert {"POST /v1/chat/completions", "tokenpace.stream", "tokenpace.backend_attempt"} <= names
