"""The gateway's routes: the OpenAI API, operations, and tokenpace's own.

``POST /v1/chat/completions``, ``POST /v1/completions`` (:mod:`gateway.request.completions`),
``GET /v1/models``, ``GET /v1/models/{model}``, ``GET``/``HEAD /healthz`` and
``/readyz``, ``GET /metrics``,
``POST /v1/tokenpace/telemetry`` and ``GET /v1/tokenpace/qoe``
(:mod:`gateway.telemetry.reports`), ``POST /v1/tokenpace/reader``
(:mod:`gateway.relay.reader`). Administration is in :mod:`gateway.http.admin`.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations (their
# parameters and dependencies) where the routes are defined.

from typing import Annotated, Any

from fastapi import FastAPI, Query, Request, Security
from fastapi.security import HTTPAuthorizationCredentials
from starlette.responses import JSONResponse, Response

from gateway.backends.routing import Router
from gateway.config.schema import TenantConfig
from gateway.context import request_record
from gateway.errors import forbidden
from gateway.http.admin import tenant_not_found
from gateway.http.auth import caller_of, tenant_bearer, tenant_key, tenant_of
from gateway.http.openapi import (
    ERROR_RESPONSES,
    READER_SIGNAL_SCHEMA,
    STORE_DOWN,
    TELEMETRY_SCHEMA,
    completion_request,
    completion_responses,
)
from gateway.relay.drain import Drain
from gateway.relay.reader import ReaderChannel
from gateway.request.completions import CompletionService, model_not_found
from gateway.request.schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ErrorResponse,
    Health,
    Model,
    ModelList,
)
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.reports import Telemetry
from gateway.telemetry.tokens import TOKEN_HEADER

# The completion routes name the tenant key in the OpenAPI document without running
# ``tenant_bearer`` as a dependency, as the reader's route does. They read the tenant
# with ``tenant_of``.
TENANT_KEY_REQUIRED: dict[str, Any] = {"security": [{tenant_bearer.scheme_name: []}]}


def token_header(note: str | None = None) -> dict[str, Any]:
    """The OpenAPI parameter of the telemetry token header, which a report or a reader
    signal may carry instead of the API key; ``note``: what else to say of it."""
    description = (
        "the request's telemetry token, instead of the API key (or, text/plain for "
        "sendBeacon, as the body's 'telemetry_token')"
    )
    return {
        "name": TOKEN_HEADER,
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
        "description": description if note is None else f"{description}; {note}",
    }


def add_api_routes(
    app: FastAPI,
    *,
    service: CompletionService,
    router: Router,
    telemetry_service: Telemetry,
    gateway_metrics: GatewayMetrics,
    drain: Drain,
    readers: ReaderChannel,
) -> None:
    """The OpenAI API, operations and tokenpace's own routes; every caller was
    authenticated by :class:`~gateway.http.gate.AccessGate` (:mod:`gateway.http.auth`)."""
    reports = telemetry_service
    tenant_names = {t.name for t in service.config.tenants}

    # The completion routes read and validate their bodies themselves
    # (gateway.request.body.parse_body, FastAPI's answers): FastAPI solves
    # no dependency on the gateway's hottest routes.
    @app.post(
        "/v1/chat/completions",
        tags=["openai"],
        summary="Create a chat completion (OpenAI-compatible)",
        response_model=None,
        responses=completion_responses(ChatCompletion),
        openapi_extra={**TENANT_KEY_REQUIRED, **completion_request(ChatCompletionRequest)},
    )
    async def chat_completions(request: Request) -> Response:
        record = request_record(request.scope)
        return await service.serve(request, record, "chat.completions", tenant_of(request))

    @app.post(
        "/v1/completions",
        tags=["openai"],
        summary="Create a text completion (OpenAI-compatible)",
        response_model=None,
        responses=completion_responses(Completion),
        openapi_extra={**TENANT_KEY_REQUIRED, **completion_request(CompletionRequest)},
    )
    async def completions(request: Request) -> Response:
        record = request_record(request.scope)
        return await service.serve(request, record, "completions", tenant_of(request))

    @app.post(
        "/v1/tokenpace/reader",
        tags=["tokenpace"],
        summary="Say what the reader of a stream is doing (SDKs, while the stream runs)",
        status_code=202,
        responses={
            202: {"description": "Accepted and handed to the engine that runs the reply"},
            **{k: ERROR_RESPONSES[k] for k in (400, 401, 413)},
            403: {
                "model": ErrorResponse,
                "description": "The telemetry token is for another request",
            },
            404: {"model": ErrorResponse, "description": "Not a request id of this tenant"},
            429: {
                "model": ErrorResponse,
                "description": "Sooner than 0.25 s after the request's last signal with the same "
                "presence (`reader_signal_rate`, Retry-After): send the newest state then",
            },
            503: STORE_DOWN,
        },
        openapi_extra={
            **TENANT_KEY_REQUIRED,
            "parameters": [token_header("it stays valid for the QoE report")],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": READER_SIGNAL_SCHEMA}},
            },
        },
    )
    async def reader(request: Request) -> JSONResponse:
        """With the API key, or the response's telemetry token (header, or in the body).
        Routed right after the completions, with no dependency to solve: every stream's
        client may send several a second."""
        caller = caller_of(request)
        tenant = caller.tenant
        assert tenant is not None, "the gate admits a tenant's key or a telemetry token"
        result = await readers.accept(tenant.name, await request.body(), caller.report_on)
        return JSONResponse(result, status_code=202)

    @app.get(
        "/v1/models",
        tags=["openai"],
        summary="List the models the backends serve",
        response_model=ModelList,
        responses={401: ERROR_RESPONSES[401], 503: STORE_DOWN},
    )
    async def models(tenant: Annotated[TenantConfig, Security(tenant_key)]) -> ModelList:
        return ModelList(data=[Model(**card) for card in router.model_cards()])

    @app.get(
        "/v1/models/{model:path}",
        tags=["openai"],
        summary="Retrieve a model the backends serve",
        response_model=Model,
        responses={401: ERROR_RESPONSES[401], 404: ERROR_RESPONSES[404], 503: STORE_DOWN},
    )
    async def model(model: str, tenant: Annotated[TenantConfig, Security(tenant_key)]) -> Model:
        card = next((c for c in router.model_cards() if c["id"] == model), None)
        if card is not None:
            return Model(**card)
        if router.knows_model(model):  # a backend that serves any name ("*")
            return Model(id=model)
        raise model_not_found(model)

    @app.get(
        "/healthz",
        tags=["ops"],
        summary="Liveness: the process serves HTTP",
        response_model=Health,
    )
    async def healthz() -> Health:
        return Health(status="ok")

    @app.get(
        "/readyz",
        tags=["ops"],
        summary="Readiness: at least one backend is healthy, and not shutting down",
        response_model=Health,
        responses={503: {"model": Health, "description": "No healthy backend, or draining"}},
    )
    async def readyz() -> Response:
        ready = router.any_healthy() and not drain.draining
        status = "draining" if drain.draining else "ready" if ready else "not ready"
        body = Health(status=status, backends={s.name: s.healthy for s in router.states})
        return JSONResponse(body.model_dump(), status_code=200 if ready else 503)

    # Load balancers probe with HEAD: the same answer without its body (the server
    # drops it), kept out of the OpenAPI document, which lists each probe once.
    for path, probe in (("/healthz", healthz), ("/readyz", readyz)):
        app.add_api_route(path, probe, methods=["HEAD"], include_in_schema=False)

    @app.get(
        "/metrics",
        tags=["ops"],
        summary="Prometheus metrics",
        response_class=Response,
        responses={
            200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
            401: {"model": ErrorResponse, "description": "metrics.token is set: it is needed"},
            404: {"model": ErrorResponse, "description": "metrics.port is set: served there"},
        },
    )
    async def metrics() -> Response:
        await reports.refresh_metrics()
        payload, content_type = gateway_metrics.render()
        return Response(payload, media_type=content_type)

    @app.post(
        "/v1/tokenpace/telemetry",
        tags=["tokenpace"],
        summary="Report the QoE timelines of one request (SDKs)",
        responses={
            200: {"description": "Stored: the QoE the gateway recomputed (`stored: true`)"},
            202: {
                "description": "Accepted while the shared store is unreachable (`stored: "
                "false`): kept with its request's ownership and stored when the store "
                "returns, unless it proves a second report of the request"
            },
            **{k: ERROR_RESPONSES[k] for k in (400, 401, 413)},
            403: {
                "model": ErrorResponse,
                "description": "The telemetry token is for another request, or already used",
            },
            404: {"model": ErrorResponse, "description": "Not a request id of this tenant"},
            409: {"model": ErrorResponse, "description": "The request was already reported"},
            429: {"model": ErrorResponse, "description": "Too many reports (Retry-After)"},
            503: STORE_DOWN,
        },
        openapi_extra={
            "parameters": [token_header()],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": TELEMETRY_SCHEMA}},
            },
        },
    )
    async def telemetry(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Security(tenant_bearer)],
    ) -> JSONResponse:
        """With the API key, or the response's telemetry token (header, or in the body)."""
        tenant, token_for = tenant_of(request), caller_of(request).report_on
        result = await reports.report(tenant.name, await request.body(), token_for)
        return JSONResponse(result, status_code=200 if result["stored"] else 202)

    @app.get(
        "/v1/tokenpace/qoe",
        tags=["tokenpace"],
        summary="QoE summary: client-side and gateway-side, per tier, over a window",
        responses={
            400: {"model": ErrorResponse, "description": "A bad query parameter"},
            401: ERROR_RESPONSES[401],
            403: ERROR_RESPONSES[403],
            404: {"model": ErrorResponse, "description": "No such tenant (admin key)"},
            503: STORE_DOWN,
        },
    )
    async def qoe(
        request: Request,
        window: Annotated[
            int | None, Query(ge=1, description="seconds (default telemetry.window_s)")
        ] = None,
        tenant: Annotated[str | None, Query(description="one tenant (admin key only)")] = None,
    ) -> dict[str, Any]:
        window_s = min(window or reports.cfg.window_s, reports.cfg.retention_s)
        caller = caller_of(request)
        if caller.tenant is not None:  # not the admin
            if tenant is not None and tenant != caller.tenant.name:
                raise forbidden("Only the admin key may read another tenant's QoE.", "tenant")
            tenant = caller.tenant.name
        elif tenant is not None and tenant not in tenant_names:
            raise tenant_not_found(tenant)
        return await reports.summary(tenant, window_s)
