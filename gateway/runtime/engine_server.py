"""In-process engines served once over HTTP, for a gateway of several worker processes.

``tokenpace serve --workers N`` runs each ``kind: embedded`` backend (the simulated
engine, :mod:`gateway.backends.embedded`) in one place: the supervisor serves it on a loopback
port with this module, and every worker reaches it as an ``http`` backend with
``tokenpace: true``. What the in-process engine reads from the request context (tier,
TTFT, TDS, tenant, weight, request id) travels in the ``vllm_xargs`` tags
(docs/protocol.md, "Gateway → engine"), parsed as the vLLM plugin parses them
(:mod:`qos.tags`). The engine's clock starts when it receives the request, as a
vLLM upstream's does.

Reader signals (:mod:`qos.signals`): the workers need the shared store (Redis), and every
worker publishes the signals it accepts on its channel; the engine server subscribes
there too (:class:`~gateway.store.pubsub.ChannelListener`, within its lifespan) and hands
each one to its engines, which apply it to the request the ``tp_request_id`` tag names,
as the vLLM plugin does (:mod:`qos.vllm.reader_channel`). The worker relaying a stream
ends it on ``left``, which closes its request here and aborts it in the engine.

Routes, per backend name: ``POST /{name}/v1/chat/completions``,
``POST /{name}/v1/completions`` (OpenAI streaming and non-streaming),
``GET /{name}/v1/models`` and ``GET /{name}/v1/health``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
import uvicorn
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.backends import Backend, BackendError, BackendRuntime, ChunkStream
from gateway.backends.http import HttpBackend
from gateway.config.schema import BackendConfig, GatewayConfig, HealthConfig, TimeoutsConfig
from gateway.context import Endpoint, RequestContext, ResolvedTier
from gateway.errors import INVALID_REQUEST
from gateway.runtime.server import listen
from gateway.store.pubsub import ChannelListener
from qos.signals import channel, decode_wire
from qos.tags import RequestTags, decode_tags

log = logging.getLogger("tokenpace.gateway.engines")

_DEFAULT_TAGS = RequestTags()
_STARTUP_S = 30.0


def _error(exc: BackendError) -> JSONResponse:
    """``exc`` as an HTTP answer. A 5xx the engine does not blame on its health (it is
    full) goes out as 429: the gateway then tries another backend, or answers it, without
    marking this one down, as it would with the engine in process."""
    status = exc.status
    if status >= 500 and exc.retryable and not exc.unhealthy:
        status = 429
    headers = {"Retry-After": f"{exc.retry_after_s:g}"} if exc.retry_after_s else None
    return JSONResponse(exc.body, status_code=status, headers=headers)


def _context(body: Mapping[str, Any], endpoint: Endpoint, request: Request) -> RequestContext:
    """The request context the gateway's tags describe (defaults where a tag is missing)."""
    received = time.monotonic()
    xargs = body.get("vllm_xargs")
    tags, _ = decode_tags(xargs if isinstance(xargs, Mapping) else None, _DEFAULT_TAGS)
    request_id = tags.request_id or request.headers.get("x-request-id") or uuid.uuid4().hex
    return RequestContext(
        request_id=request_id,
        tenant=tags.tenant,
        weight=tags.weight,
        tier=ResolvedTier(tags.tier, tags.ttft, tags.tds, 0),
        endpoint=endpoint,
        model=str(body.get("model", "")),
        stream=bool(body.get("stream")),
        received_at=received,
        expected_tokens=0,
    )


async def _events(stream: ChunkStream) -> AsyncIterator[dict[str, str]]:
    """The stream as server-sent events, ``[DONE]`` last; a failure is an error event."""
    try:
        while payloads := (await stream.next_batch()).payloads:
            for payload in payloads:  # each chunk's JSON, as the engine's stream encoded it
                yield {"data": payload.decode()}
        yield {"data": "[DONE]"}
    except BackendError as exc:
        yield {"data": orjson.dumps(exc.body).decode()}
    finally:
        await stream.aclose()


def _to_engines(engines: Sequence[Backend]) -> Callable[[bytes], None]:
    """The reader channel's handler: each signal to the engines (the one running the
    request applies it; a message that is not a signal is logged and dropped)."""

    def deliver(message: bytes) -> None:
        try:
            request_id, signal = decode_wire(message)
        except ValueError as exc:
            log.warning("reader channel: dropped a message that is not a signal (%s)", exc)
            return
        for engine in engines:
            engine.reader_signal(request_id, signal)

    return deliver


def engine_app(engines: Sequence[Backend], config: GatewayConfig) -> Starlette:
    """The HTTP face of ``engines`` (started and closed by the app's lifespan)."""
    by_name = {e.name: e for e in engines}

    def engine_of(request: Request) -> Backend:
        engine = by_name.get(request.path_params["backend"])
        if engine is None:
            raise BackendError("No such engine.", status=404, code="model_not_found")
        return engine

    async def generate(request: Request, endpoint: Endpoint) -> Response:
        try:
            engine = engine_of(request)
            try:
                body = orjson.loads(await request.body())
            except ValueError:
                body = None
            if not isinstance(body, dict):
                raise BackendError(
                    "The body must be a JSON object.", status=400, type=INVALID_REQUEST
                )
            ctx = _context(body, endpoint, request)
            if not ctx.stream:
                return JSONResponse(await engine.complete(endpoint, body, ctx))
            stream = await engine.open_stream(endpoint, body, ctx)
        except BackendError as exc:
            return _error(exc)
        return EventSourceResponse(_events(stream), sep="\n")

    async def chat(request: Request) -> Response:
        return await generate(request, "chat.completions")

    async def completions(request: Request) -> Response:
        return await generate(request, "completions")

    async def health(request: Request) -> Response:
        try:
            ok = await engine_of(request).check_health()
        except BackendError as exc:
            return _error(exc)
        return Response(status_code=200 if ok else 503)

    async def models(request: Request) -> Response:
        try:
            engine = engine_of(request)
        except BackendError as exc:
            return _error(exc)
        cards = [{"id": m, "object": "model", **engine.model_card(m)} for m in engine.models]
        return JSONResponse({"object": "list", "data": cards})

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with httpx.AsyncClient() as client:
            runtime = BackendRuntime(http=client, config=config)
            started: list[Backend] = []
            listener: ChannelListener | None = None
            try:
                for engine in engines:
                    await engine.start(runtime)
                    started.append(engine)
                store = config.store
                if store.redis_url is not None:
                    readers = channel(store.key_prefix)
                    listener = ChannelListener(store.redis_url, readers, _to_engines(engines))
                yield
            finally:
                if listener is not None:
                    await listener.aclose()
                for engine in reversed(started):
                    await engine.aclose()

    prefix = "/{backend}/v1"
    return Starlette(
        routes=[
            Route(f"{prefix}/chat/completions", chat, methods=["POST"]),
            Route(f"{prefix}/completions", completions, methods=["POST"]),
            Route(f"{prefix}/models", models, methods=["GET"]),
            Route(f"{prefix}/health", health, methods=["GET"]),
        ],
        lifespan=lifespan,
    )


class EngineServer:
    """``engines`` served on a free loopback port by uvicorn in a thread of this process."""

    def __init__(self, engines: Sequence[Backend], config: GatewayConfig) -> None:
        self.engines = list(engines)
        self._sock = listen("127.0.0.1", 0)
        self.port: int = self._sock.getsockname()[1]
        self._server = uvicorn.Server(
            uvicorn.Config(
                engine_app(self.engines, config),
                ws="none",
                lifespan="on",
                access_log=False,
                log_level="warning",
                timeout_graceful_shutdown=1,
            )
        )
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name="tokenpace-engines"
        )

    def url(self, engine: str) -> str:
        """The base URL (with ``/v1``) an ``http`` backend uses for ``engine``."""
        return f"http://127.0.0.1:{self.port}/{engine}/v1"

    def start(self) -> None:
        """Serve; returns once the engines run (RuntimeError if they could not start)."""
        self._thread.start()
        deadline = time.monotonic() + _STARTUP_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the embedded engines did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join()
        self._sock.close()


class EngineServerBackend(HttpBackend):
    """An engine of an :class:`EngineServer`, reached over HTTP, described as it describes
    itself in ``/v1/models`` (the simulated engine says it is a simulation)."""

    def __init__(
        self,
        cfg: BackendConfig,
        timeouts: TimeoutsConfig,
        health: HealthConfig,
        cards: Mapping[str, dict[str, Any]],
    ) -> None:
        super().__init__(cfg, timeouts, health)
        self._cards = dict(cards)

    def model_card(self, model: str) -> dict[str, Any]:
        return self._cards.get(model, {})


def served_backend_config(
    cfg: BackendConfig, url: str, throughput_tps: float | None
) -> BackendConfig:
    """``cfg`` (an in-process engine's entry) as the ``http`` backend that reaches it at ``url``."""
    return cfg.model_copy(
        update={
            "kind": "http",
            "url": url,
            "tokenpace": True,
            "health_path": "health",
            "throughput_tps": cfg.throughput_tps or throughput_tps,
            "options": {},
        }
    )
