"""The composition root: ``create_app(config)`` builds every component and wires them.

Each component gets the narrow dependencies it uses (a configuration section, the
store, the router, the metrics); nothing below this module reaches for the others. A
request goes through the HTTP server's connection limits (:mod:`gateway.runtime.server`),
:class:`~gateway.http.middleware.GatewayMiddleware`, CORS,
:class:`~gateway.http.gate.AccessGate`, then its route (:mod:`gateway.http.routes`,
:mod:`gateway.http.admin`). docs/architecture/gateway.md describes the whole path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp

from gateway.admission.controller import AdmissionController
from gateway.backends import Backend, BackendRuntime
from gateway.backends.http import build_http_client
from gateway.backends.kinds import build_backends
from gateway.backends.routing import Router
from gateway.background import stop
from gateway.config.schema import GatewayConfig, TenantConfig
from gateway.http.admin import add_admin_routes
from gateway.http.admin_status import add_status_route
from gateway.http.auth import Authenticator
from gateway.http.errors import install_error_handlers
from gateway.http.gate import AccessGate
from gateway.http.keys import KeyCache
from gateway.http.middleware import GatewayMiddleware
from gateway.http.openapi import openapi_document
from gateway.http.pages import add_page_routes
from gateway.http.routes import add_api_routes
from gateway.relay.dispatch import Dispatcher
from gateway.relay.drain import DRAIN_STATE_KEY, Drain
from gateway.relay.reader import ReaderChannel
from gateway.request.completions import CompletionService
from gateway.request.tiers import TIER_HEADER
from gateway.store import ResilientStore, Store, build_store
from gateway.telemetry.history import LoadHistory
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.reports import Telemetry
from gateway.telemetry.tokens import TOKEN_HEADER, TelemetryTokens
from gateway.telemetry.tracing import Tracing
from gateway.version import VERSION

log = logging.getLogger("tokenpace.gateway")

_EXPOSED_HEADERS = [
    "X-Request-Id",
    "X-TokenPace-Tier",
    "X-TokenPace-TTFT",
    "X-TokenPace-TDS",
    TOKEN_HEADER,
    "Retry-After",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
]


@dataclass(frozen=True, eq=False)
class Gateway:
    """What :func:`create_app` built (``app.state.gateway``), for operators and tests;
    the request path never reads it."""

    config: GatewayConfig
    backends: list[Backend]
    router: Router
    metrics: GatewayMetrics
    store: Store
    keys: KeyCache
    admission: AdmissionController
    telemetry: Telemetry
    telemetry_tokens: TelemetryTokens
    drain: Drain
    readers: ReaderChannel


def create_app(
    config: GatewayConfig,
    *,
    backends: list[Backend] | None = None,
    tracing: Tracing | None = None,
    request_id_prefix: str = "",
) -> FastAPI:
    """The gateway for ``config``.

    ``backends`` replaces the ones built from ``config.backends`` (to plug in-process
    engines or test doubles without a configuration entry); ``tracing`` the traces the
    ``OTEL_*`` variables configure (:mod:`gateway.telemetry.tracing`);
    ``request_id_prefix`` begins every request id (a worker's holder tag,
    :mod:`gateway.runtime.holders`). The app's lifespan starts the shared HTTP client,
    the backends and the health checks; serve it under an ASGI server that runs lifespan
    events (uvicorn does).
    """
    own_tracing = tracing is None
    traces = Tracing.from_environment() if tracing is None else tracing
    backend_list = list(backends) if backends is not None else build_backends(config)
    tenants: dict[str, TenantConfig] = {t.name: t for t in config.tenants}
    router = Router(backend_list, config)
    metrics = GatewayMetrics(router)
    store = build_store(config, metrics.store)
    keys = KeyCache(store, config.store.key_cache_s)
    caps = {b.name: b.max_concurrent or 0 for b in config.backends}
    admission = AdmissionController(
        config.admission, caps, store, router, metrics, tenants=len(config.tenants)
    )
    telemetry = Telemetry(config.telemetry, config.limits, store, metrics)
    telemetry_tokens = TelemetryTokens(config.telemetry, store, tenants)
    history = LoadHistory(metrics, tenants)
    auth = Authenticator(
        keys, tenants, telemetry_tokens, config.admin.key_sha256, config.metrics.token_sha256
    )
    dispatcher = Dispatcher(router, metrics, config.timeouts, config.health.interval_s)
    drain = Drain(config.server.drain_s)
    readers = ReaderChannel(store, config.store.key_prefix, metrics)
    service = CompletionService(
        config,
        router,
        admission,
        dispatcher,
        telemetry,
        telemetry_tokens,
        metrics,
        drain,
        readers,
        traces,
    )
    if isinstance(store, ResilientStore):
        store.on_reconnect = admission.renew
    gateway = Gateway(
        config,
        backend_list,
        router,
        metrics,
        store,
        keys,
        admission,
        telemetry,
        telemetry_tokens,
        drain,
        readers,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Drain]]:
        client = build_http_client(config)
        traces.instrument_client(client)
        runtime = BackendRuntime(http=client, config=config)
        started: list[Backend] = []
        health_task: asyncio.Task[None] | None = None
        try:
            with traces.quiet():  # no traces of health checks and polls (their tasks too)
                await store.start()
                await store.seed_keys(
                    {digest: t.name for digest, t in config.tenant_by_digest().items()},
                    {t.name: t.model_dump_json(exclude={"api_keys"}) for t in config.tenants},
                )
                admission.start()
                telemetry.start()
                readers.start()
                history.start()
                for b in backend_list:
                    await b.start(runtime)
                    started.append(b)
                await router.check_all()
                health_task = asyncio.create_task(router.health_loop(), name="tokenpace-health")
            log.info(
                "gateway ready: %d backend(s), %d healthy",
                len(backend_list),
                sum(s.healthy for s in router.states),
            )
            yield {DRAIN_STATE_KEY: drain}  # the server begins it as it stops
        finally:
            drain.close()
            if health_task is not None:
                await stop(health_task)
            for b in reversed(started):
                try:
                    await b.aclose()
                except Exception:
                    log.warning("closing backend %s failed", b.name, exc_info=True)
            await history.aclose()
            await admission.aclose()
            await telemetry.aclose()
            await store.aclose()
            await client.aclose()
            if own_tracing:  # the last spans exported, off the event loop
                await asyncio.to_thread(traces.shutdown)

    app = FastAPI(
        title="tokenpace gateway",
        version=VERSION,
        description=(
            "OpenAI-compatible front door with QoE tiers. Choose a tier with the "
            "`X-TokenPace-Tier` header or the body's `tokenpace` field; see "
            "docs/protocol.md."
        ),
        lifespan=lifespan,
        # server.docs: false turns off the document and /docs (a page of
        # gateway.http.pages: Swagger UI served by the gateway, not FastAPI's from a CDN)
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json" if config.server.docs else None,
    )
    app.state.gateway = gateway
    traces.instrument_app(app)  # before the stack is wrapped below: its server span inside
    install_error_handlers(app, admission.refused)
    add_api_routes(
        app,
        service=service,
        router=router,
        telemetry_service=telemetry,
        gateway_metrics=metrics,
        drain=drain,
        readers=readers,
    )
    add_admin_routes(app, tenants, store, keys)
    add_status_route(app, store, router, metrics, tenants, history)
    add_page_routes(app, docs=config.server.docs)
    tiers, max_points = list(config.tiers), config.telemetry.max_points
    app.openapi = lambda: openapi_document(app, tiers, max_points)  # type: ignore[method-assign]
    # inside CORS: its 401 and 413 carry CORS headers
    app.add_middleware(
        AccessGate,
        auth=auth,
        limits=config.limits,
        telemetry=config.telemetry,
        refused=admission.refused,
        tracing=traces,
    )
    if config.cors.allow_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=config.cors.allow_origins,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", TIER_HEADER, TOKEN_HEADER],
            expose_headers=_EXPOSED_HEADERS,
        )
    # Outermost, around Starlette's ServerErrorMiddleware too, so that even a 500 carries
    # X-Request-Id and is counted.
    build_stack = app.build_middleware_stack

    def outermost() -> ASGIApp:
        return GatewayMiddleware(build_stack(), metrics, config.metrics, request_id_prefix)

    app.build_middleware_stack = outermost  # type: ignore[method-assign]
    return app
