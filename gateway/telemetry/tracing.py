"""OpenTelemetry traces of the gateway's requests: optional, and free when off.

On when an OTLP endpoint is configured the standard way (``OTEL_EXPORTER_OTLP_ENDPOINT``
or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), unless ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none``; the OpenTelemetry SDK reads the rest (the service name and
resource, the sampler, the exporter's headers and timeouts). Spans go over OTLP/HTTP
(protobuf) in batches, from each gateway process.

One span per request, the HTTP server span of OpenTelemetry's FastAPI instrumentation
(the client's ``traceparent`` continues its trace; ``/healthz``, ``/readyz`` and
``/metrics`` are not traced), with children:

- ``tokenpace.authenticate``: the credential checked (:class:`~gateway.http.gate.AccessGate`);
- ``tokenpace.admission``: the wait for a backend slot in the fair-share queue;
- ``tokenpace.backend_attempt``, one per backend tried, in order (``tokenpace.attempt``
  0, 1, ...): an attempt that failed has status ERROR and ``error.type``, and the next
  one is the failover. An HTTP backend's attempt has the HTTP client span of
  OpenTelemetry's httpx instrumentation under it, whose ``traceparent`` the backend
  receives, so vLLM's own spans join the trace;
- ``tokenpace.stream``: the streamed body, from its first write to its end (a failover
  while nothing reached the client is an attempt under it).

Attributes follow the GenAI semantic conventions where they exist (``gen_ai.operation.name``,
``gen_ai.request.model``, ``gen_ai.request.max_tokens``, ``gen_ai.usage.*_tokens``), plus
the tenant, tier (its TTFT and TDS), backend and outcome, the gateway-side QoE (Andes
Eq. 1 and the monotone QoE) and the longest freeze of the reply on the gateway-side
timeline shown at the tier's pace (:func:`qos.metrics.freezes`).

When off, :data:`TRACING_OFF` answers everything with nothing: no span, no context
switch, no instrumentation installed (the request path checks one attribute).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.context import RequestContext, StreamOutcome
from gateway.version import VERSION

if TYPE_CHECKING:
    import httpx
    from fastapi import FastAPI
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

    from qos.metrics import ReplyQoE

SERVICE_NAME = "tokenpace-gateway"
UNTRACED_URLS = "/healthz,/readyz,/metrics"  # probes and scrapes: no trace each
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
Attributes = Mapping[str, str | bool | int | float]


def tracing_wanted(environ: Mapping[str, str]) -> bool:
    """Whether the ``OTEL_*`` variables in ``environ`` ask for traces."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def otlp_provider() -> TracerProvider:
    """A tracer provider exporting to the configured OTLP endpoint, in batches."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.version": VERSION})  # and OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))  # no OTEL_SERVICE_NAME
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


class Tracing:
    """The gateway's tracer, or nothing (``provider`` None): see the module docstring."""

    def __init__(self, provider: TracerProvider | None) -> None:
        self.provider = provider
        self.tracer: Tracer | None = None
        if provider is not None:
            self.tracer = provider.get_tracer("tokenpace.gateway", VERSION)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Tracing:
        """On when the ``OTEL_*`` variables configure an OTLP endpoint; else off."""
        if not tracing_wanted(os.environ if environ is None else environ):
            return TRACING_OFF
        return cls(otlp_provider())

    @property
    def on(self) -> bool:
        return self.tracer is not None

    # -- instrumentation ------------------------------------------------------------
    def instrument_app(self, app: FastAPI) -> None:
        """The HTTP server span of every request (before the app's middleware is built)."""
        if self.provider is None:
            return
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        FastAPIInstrumentor.instrument_app(
            app,
            tracer_provider=self.provider,
            excluded_urls=UNTRACED_URLS,
            exclude_spans=["receive", "send"],  # a span per chunk written: no
        )

    def instrument_client(self, client: httpx.AsyncClient) -> None:
        """An HTTP client span per upstream request, ``traceparent`` sent upstream."""
        if self.provider is None:
            return
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

        HTTPXClientInstrumentor.instrument_client(client, tracer_provider=self.provider)

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """No HTTP client spans for what starts here (health checks, metrics polls: the
        tasks started inside inherit it)."""
        if self.provider is None:
            yield
            return
        from opentelemetry.instrumentation.utils import suppress_http_instrumentation

        with suppress_http_instrumentation():
            yield

    def shutdown(self) -> None:
        """Export what is left (at most the SDK's export timeout)."""
        if self.provider is not None:
            self.provider.shutdown()

    # -- spans ----------------------------------------------------------------------
    def span(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """A child span of the current one, for a ``with`` block; nothing when off."""
        if self.tracer is None:
            return contextlib.nullcontext()
        return self.tracer.start_as_current_span(name)

    def request(self, attributes: Attributes) -> RequestTrace | None:
        """The trace of the request being served (its server span, given
        ``attributes``); None when off."""
        if self.tracer is None:
            return None
        from opentelemetry import trace

        span = trace.get_current_span()
        span.set_attributes(attributes)
        return RequestTrace(self.tracer, span)


TRACING_OFF = Tracing(None)


@dataclass(frozen=True, slots=True)
class RequestTrace:
    """One request's spans: its server span and the tracer of its children."""

    tracer: Tracer
    span: Span

    def set(self, attributes: Attributes) -> None:
        """Attributes of the request's span."""
        self.span.set_attributes(attributes)

    def child(self, name: str, attributes: Attributes | None = None) -> Any:
        """A child span of the current one, for a ``with`` block."""
        return self.tracer.start_as_current_span(name, attributes=attributes)

    def start(self, name: str, attributes: Attributes) -> Span:
        """A child span of the current one, ended by :func:`end_span`."""
        return self.tracer.start_span(name, attributes=attributes)

    @staticmethod
    def current(span: Span) -> contextlib.AbstractContextManager[Any]:
        """``span`` the current span for a ``with`` block (child spans nest under it)."""
        from opentelemetry import trace

        return trace.use_span(span, end_on_exit=False)


def end_span(span: Span, error: str | None = None, error_type: str | None = None) -> None:
    """End ``span``; with ``error``, as failed (``error.type``: ``error_type``)."""
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, error))
        span.set_attribute("error.type", error_type or "error")
    span.end()


def span_of(trace: RequestTrace | None, name: str) -> contextlib.AbstractContextManager[Any]:
    """A child span of the request's current span for a ``with`` block; nothing when the
    request is not traced."""
    return contextlib.nullcontext() if trace is None else trace.child(name)


def request_attributes(ctx: RequestContext, max_tokens: int | None, choices: int) -> Attributes:
    """The request span's attributes known before admission (GenAI conventions first)."""
    chat = ctx.endpoint == "chat.completions"
    attributes: dict[str, str | bool | int | float] = {
        "gen_ai.operation.name": "chat" if chat else "text_completion",
        "gen_ai.request.model": ctx.model,
        "tokenpace.request_id": ctx.request_id,
        "tokenpace.tenant": ctx.tenant,
        "tokenpace.tier": ctx.tier.name,
        "tokenpace.tier.ttft_s": ctx.tier.ttft,
        "tokenpace.tier.tds": ctx.tier.tds,
        "tokenpace.stream": ctx.stream,
    }
    if max_tokens is not None:
        attributes["gen_ai.request.max_tokens"] = max_tokens
    if choices != 1:
        attributes["gen_ai.request.choice.count"] = choices
    return attributes


def outcome_attributes(
    result: StreamOutcome,
    input_tokens: int | None,
    qoe: ReplyQoE | None,
    longest_freeze_s: float | None,
) -> Attributes:
    """How a stream ended: tokens, TTFT, the gateway-side QoE (a completed stream's) and
    the longest freeze."""
    attributes: dict[str, str | bool | int | float] = {
        "gen_ai.usage.output_tokens": result.tokens,
        "tokenpace.backend": result.backend,
        "tokenpace.outcome": result.outcome,
    }
    optional = {
        "gen_ai.usage.input_tokens": input_tokens,
        "tokenpace.ttft_s": result.ttft_s,
        "tokenpace.qoe.andes": None if qoe is None else qoe.andes,
        "tokenpace.qoe.monotone": None if qoe is None else qoe.monotone,
        "tokenpace.freeze.longest_s": longest_freeze_s,
    }
    attributes.update({k: v for k, v in optional.items() if v is not None})
    return attributes
