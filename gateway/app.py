"""The FastAPI application: ``create_app(config)``.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``,
``GET /healthz``, ``GET /readyz``, ``GET /metrics``, ``POST /v1/tokenpace/telemetry``
and ``GET /v1/tokenpace/qoe`` (:mod:`gateway.telemetry`), ``/v1/tokenpace/admin/*``
(:mod:`gateway.admin`). A completion request goes through

0. the HTTP server's connection limits (:mod:`gateway.server`): header size (431),
   header and body read timeouts (408), the connection cap (503);
1. :class:`GatewayMiddleware` (pure ASGI): request id, receipt time, the
   ``X-Request-Id`` response header, the request counter, the in-flight gauge, the
   access log line, and who may read ``/metrics``;
2. :class:`BodyGate` (pure ASGI, inside CORS): authentication from the headers
   (``Authorization: Bearer KEY`` → tenant via the store's key digests, cached per
   replica, else 401) before the body is read, then the body within its limit (413
   before it is parsed);
3. validation of the body (the models in :mod:`gateway.schemas`, a body the backend's
   JSON encoder could not write, then the configured caps) → 400;
4. tier resolution (:mod:`gateway.tiers`) → 400/403; the model → 404;
5. admission (:mod:`gateway.admission`): rate limits and budget → 429, then a wait in
   the fair-share (VTC) queue until a backend slot is free; the slot is held until the
   response ends, and streamed tokens are charged to the tenant as they go;
6. dispatch: streaming via :class:`gateway.streaming.StreamRelay` under sse-starlette,
   non-streaming via :func:`gateway.dispatch.complete_with_failover`, both with
   failover before the first byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hmac
import logging
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypeVar

import orjson
from fastapi import FastAPI, Header, Query, Request, Security
from fastapi.openapi.utils import get_openapi
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sse_starlette.sse import EventSourceResponse
from starlette.background import BackgroundTask
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import gateway.embedded  # noqa: F401 - registers the backend kind "embedded" (the demo)
from gateway.admin import ADMIN_PREFIX, add_admin_routes, is_admin
from gateway.admin_status import add_status_route
from gateway.admission import (
    AdmissionController,
    Ticket,
    store_unavailable,
)
from gateway.backends import (
    Backend,
    BackendError,
    BackendRuntime,
    Endpoint,
    RequestContext,
    Router,
    build_backends,
    build_http_client,
)
from gateway.config import GatewayConfig, TenantConfig, hash_key
from gateway.dispatch import complete_with_failover, final_error, open_attempt
from gateway.errors import (
    GatewayError,
    bad_request,
    forbidden,
    install_error_handlers,
    model_not_found,
    not_found,
    too_large,
    unauthorized,
)
from gateway.keys import KeyCache
from gateway.logs import request_id_var
from gateway.metrics import UNKNOWN, GatewayMetrics
from gateway.pages import add_page_routes
from gateway.schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ErrorResponse,
    Health,
    Model,
    ModelList,
)
from gateway.state import GatewayState
from gateway.store import ResilientStore, StoreUnavailable, build_store
from gateway.streaming import StreamRelay
from gateway.telemetry import Telemetry, TelemetryReport, check_size
from gateway.telemetry_token import TOKEN_HEADER, TelemetryTokens, missing_credentials, split_token
from gateway.tiers import TIER_HEADER, resolve_tier
from qos.prompt_tokens import estimate_prompt_tokens

T = TypeVar("T")
log = logging.getLogger("tokenpace.gateway")
access_log = logging.getLogger("tokenpace.gateway.access")

INFO_KEY = "tokenpace"  # scope["state"][INFO_KEY]: the request's labels and timings
TENANT_KEY = "tokenpace_tenant"  # scope["state"][TENANT_KEY]: the tenant BodyGate found
TELEMETRY_PATH = "/v1/tokenpace/telemetry"
METRICS_PATH = "/metrics"
_API_ENDPOINTS = {
    "/v1/chat/completions": "chat.completions",
    "/v1/completions": "completions",
    "/v1/models": "models",
    "/v1/tokenpace/telemetry": "telemetry",
}
_BODY_METHODS = {"POST", "PUT", "PATCH"}


# ---------------------------------------------------------------------------------
# middleware


class GatewayMiddleware:
    """Request id, receipt time, X-Request-Id, request metrics, access log; ``/metrics``
    only where ``metrics`` allows it (its own port, or its token)."""

    def __init__(self, app: ASGIApp, gw: GatewayState) -> None:
        self.app = app
        self.gw = gw

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        received_at = time.monotonic()
        request_id = uuid.uuid4().hex
        token = request_id_var.set(request_id)
        info: dict[str, Any] = {"request_id": request_id, "received_at": received_at}
        scope.setdefault("state", {})[INFO_KEY] = info
        path = scope.get("path", "")
        endpoint = _API_ENDPOINTS.get(path)
        status = {"code": 500}
        rid_header = (b"x-request-id", request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                headers = [h for h in message.get("headers", []) if h[0].lower() != b"x-request-id"]
                message = {**message, "headers": [*headers, rid_header]}
            await send(message)

        gauge = self.gw.metrics.in_flight.labels(endpoint) if endpoint else None
        if gauge is not None:
            gauge.inc()
        try:
            refusal = _metrics_refusal(self.gw, scope, path)
            if refusal is not None:
                await refusal.response()(scope, receive, send_with_id)
                return
            await self.app(scope, receive, send_with_id)
        finally:
            if gauge is not None:
                gauge.dec()
            if endpoint is not None:
                self._record(endpoint, status["code"], info, received_at)
            request_id_var.reset(token)

    def _record(self, endpoint: str, status: int, info: dict[str, Any], received_at: float) -> None:
        outcome = info.get("outcome") or ("completed" if status < 400 else "error")
        if status == 499:
            outcome = "aborted"
        labels = (
            info.get("tenant", UNKNOWN),
            info.get("tier", UNKNOWN),
            info.get("backend", UNKNOWN),
            endpoint,
            str(status),
            outcome,
        )
        self.gw.metrics.requests.labels(*labels).inc()
        if endpoint == "models":
            return
        extra = {k: v for k, v in info.items() if k not in ("received_at",)}
        extra.update(endpoint=endpoint, status=status, outcome=outcome)
        extra["duration_s"] = round(time.monotonic() - received_at, 6)
        access_log.info("request finished", extra=extra)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return None


def _metrics_refusal(gw: GatewayState, scope: Scope, path: str) -> GatewayError | None:
    """Why this request may not have ``/metrics`` (or, on the metrics port, anything else)."""
    cfg = gw.config.metrics
    if cfg.port is not None:
        server = scope.get("server") or (None, None)
        on_metrics_port = server[1] == cfg.port
        if on_metrics_port != (path == METRICS_PATH):
            return not_found(scope.get("method", "GET"), path)
    if path == METRICS_PATH and cfg.token_sha256 is not None:
        scheme, _, token = (_header(scope, b"authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            hash_key(token.strip()), cfg.token_sha256
        ):
            return unauthorized("/metrics needs the metrics token: Authorization: Bearer TOKEN.")
    return None


class BodyGate:
    """Authenticate from the headers, then read the body within its limit.

    A request with a body is authenticated before a byte of it is read (401 else), so an
    unauthenticated client never costs the gateway body memory: a tenant key on the API
    routes, the admin key on ``/v1/tokenpace/admin/*``. The one exception is the
    telemetry route without an ``Authorization`` header: a report may carry its own
    credential inside its body (a browser beacon cannot set headers), so that body is
    read, within ``telemetry.max_body_bytes``, and its route decides. Routes the
    gateway does not have never have their body read. The body is read whole (413 past
    the limit, before any parsing) and replayed to the app; later ``receive()`` calls go
    to the server, so the app still sees ``http.disconnect``. Inside CORS, so its
    refusals carry the CORS headers a browser needs to read them.
    """

    def __init__(self, app: ASGIApp, gw: GatewayState) -> None:
        self.app = app
        self.gw = gw

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        auth = _header(scope, b"authorization")
        limit = self.gw.config.limits.max_body_bytes
        if path == TELEMETRY_PATH:
            limit = min(limit, self.gw.config.telemetry.max_body_bytes)
        try:
            if path.startswith(ADMIN_PREFIX):
                if not is_admin(self.gw, auth):
                    raise unauthorized("This route needs the gateway's admin key.")
            elif path == TELEMETRY_PATH and not auth:
                pass  # the report's own credential, if any, is inside the body
            elif path in _API_ENDPOINTS:
                tenant = await authenticate(self.gw, auth)
                scope.setdefault("state", {})[TENANT_KEY] = tenant
            else:
                await self.app(scope, receive, send)  # no such route: the body is never read
                return
        except GatewayError as exc:
            await exc.response()(scope, receive, send)
            return
        try:
            body = await _read_body(scope, receive, limit)
        except ClientGone:
            await Response(status_code=499)(scope, receive, send)  # counted; nobody reads it
            return
        if body is None:
            await too_large(limit).response()(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)


async def _read_body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None when it is (or announces being) larger than ``limit``;
    raises :class:`ClientGone` when the client went away before its end."""
    length = _header(scope, b"content-length")
    if length is not None:
        with contextlib.suppress(ValueError):
            if int(length) > limit:
                return None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        part = message.get("body", b"")
        size += len(part)
        if size > limit:
            return None
        chunks.append(part)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


# ---------------------------------------------------------------------------------
# authentication

_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="TenantKey",
    description="The tenant's API key: `Authorization: Bearer KEY`.",
)


def _gw(request: Request) -> GatewayState:
    return request.app.state.gateway


def _info(request: Request) -> dict[str, Any]:
    state = request.scope.setdefault("state", {})
    return state.setdefault(INFO_KEY, {})


async def authenticate(gw: GatewayState, authorization: str | None) -> TenantConfig:
    """The tenant owning the Bearer key in ``authorization``, else 401 (503: no store)."""
    if not authorization:
        raise unauthorized(
            "You didn't provide an API key. You need to provide your API key in an "
            "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        )
    scheme, _, key = authorization.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise unauthorized("The Authorization header must be 'Bearer YOUR_KEY'.")
    try:
        name = await gw.keys.tenant(hash_key(key))
    except StoreUnavailable:
        raise store_unavailable() from None
    tenant = gw.tenants.get(name) if name is not None else None
    if tenant is None:
        raise unauthorized("Incorrect API key provided.")
    return tenant


async def _auth_for_validation(request: Request) -> None:
    """Authentication before a validation error (FastAPI parses the body first)."""
    if request.url.path in _API_ENDPOINTS:
        tenant = await authenticate(_gw(request), request.headers.get("authorization"))
        _info(request)["tenant"] = tenant.name


async def tenant_dependency(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
) -> TenantConfig:
    tenant = request.scope.get("state", {}).get(TENANT_KEY)  # BodyGate's, for POSTs
    if tenant is None:
        tenant = await authenticate(_gw(request), request.headers.get("authorization"))
    _info(request)["tenant"] = tenant.name
    return tenant


# ---------------------------------------------------------------------------------
# the API

_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Malformed JSON, a bad field, an unknown tier"},
    401: {"model": ErrorResponse, "description": "Missing or unknown API key"},
    403: {"model": ErrorResponse, "description": "Tier (or custom tier) outside the plan"},
    404: {"model": ErrorResponse, "description": "Unknown model (code model_not_found)"},
    413: {"model": ErrorResponse, "description": "Body larger than limits.max_body_bytes"},
    429: {"model": ErrorResponse, "description": "A rate limit, budget or queue bound"},
    502: {"model": ErrorResponse, "description": "Every backend failed"},
    503: {
        "model": ErrorResponse,
        "description": "Every backend is down (backend_unavailable), the queue wait ran "
        "out (queue_timeout) or the shared store is unreachable (store_unavailable); "
        "Retry-After",
    },
    504: {"model": ErrorResponse, "description": "The backend timed out"},
}
_STORE_DOWN: dict[str, Any] = {
    "model": ErrorResponse,
    "description": "The shared store is unreachable (fail closed); Retry-After",
}
_TP_HEADERS = {
    "X-Request-Id": {
        "description": "the gateway's id for this request",
        "schema": {"type": "string"},
    },
    "X-TokenPace-Tier": {
        "description": "tier served ('custom' for explicit ttft/tds)",
        "schema": {"type": "string"},
    },
    "X-TokenPace-TTFT": {
        "description": "expected time to first token, s",
        "schema": {"type": "number"},
    },
    "X-TokenPace-TDS": {
        "description": "expected token delivery speed, tokens/s",
        "schema": {"type": "number"},
    },
    TOKEN_HEADER: {
        "description": "authenticates the telemetry report on this request without the API key",
        "schema": {"type": "string"},
    },
}
_SSE_DOC = (
    "With `stream: true`: `text/event-stream` of `data: {chunk}` events, `data: [DONE]` "
    "last; `: ping` comments may come while waiting; an error after the first chunk "
    'arrives as `data: {"error": {...}}` followed by `data: [DONE]`.'
)

# One event of the stream (OpenAPI 3.1: the event-stream schema describes each event)
_SSE_EVENT = {
    "type": "object",
    "description": "`data`: a chunk or an error object as JSON, or `[DONE]` last",
    "properties": {"data": {"type": "string"}},
    "required": ["data"],
}

TierHeader = Annotated[
    str | None,
    Header(
        alias=TIER_HEADER,
        description="QoE tier for this request (or use the body's `tokenpace.tier`)",
    ),
]


# The telemetry body is read raw (size limit and authentication before parsing), so its
# schema is given to the OpenAPI document by hand.
_TELEMETRY_SCHEMA = TelemetryReport.model_json_schema(ref_template="#/components/schemas/{model}")
_TELEMETRY_DEFS = _TELEMETRY_SCHEMA.pop("$defs", {})


def _completion_responses(model: type) -> dict[int | str, dict[str, Any]]:
    return {
        200: {
            "model": model,
            "description": "The completion; or, with `stream: true`, its chunks. " + _SSE_DOC,
            "headers": _TP_HEADERS,
            "content": {"text/event-stream": {"schema": _SSE_EVENT}},
        },
        **_ERROR_RESPONSES,
    }


def _expected_tokens(raw: dict[str, Any], gw: GatewayState) -> int:
    default = gw.config.routing.expected_output_tokens
    for key in ("max_completion_tokens", "max_tokens"):
        value = raw.get(key)
        if isinstance(value, int) and value > 0:
            default = min(default, value)
    n = raw.get("n")
    return default * (n if isinstance(n, int) and n > 1 else 1)


def _check_limits(raw: dict[str, Any], gw: GatewayState) -> None:
    limits = gw.config.limits
    for key in ("max_tokens", "max_completion_tokens"):
        value = raw.get(key)
        if isinstance(value, int) and value > limits.max_tokens:
            raise bad_request(
                f"Invalid value for '{key}': {value} is larger than this gateway's limit "
                f"of {limits.max_tokens}.",
                param=key,
                code="invalid_value",
            )
    for key in ("n", "best_of"):
        value = raw.get(key)
        if isinstance(value, int) and value > limits.max_n:
            raise bad_request(
                f"Invalid value for '{key}': at most {limits.max_n}.",
                param=key,
                code="invalid_value",
            )
    if raw.get("stream_options") is not None and not raw.get("stream"):
        raise bad_request(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            param="stream_options",
            code="invalid_value",
        )


_JSON_MAX_DEPTH = 254  # orjson, which writes the upstream body, refuses deeper nesting
_INT_RANGE = (-(2**63), 2**64 - 1)  # orjson's integers: signed or unsigned 64-bit


def _unforwardable(value: Any, param: str, depth: int = 1) -> tuple[str, str] | None:
    """The first value the upstream body cannot carry: ``(param, what is wrong)``.

    Python's JSON parser accepts integers of any size, lone surrogates (``"\\ud800"``)
    and any nesting; orjson, which writes the body for the backend, does not.
    """
    if depth > _JSON_MAX_DEPTH:
        return param, f"is nested more than {_JSON_MAX_DEPTH} levels deep"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return param, "contains a lone surrogate (\\ud800-\\udfff), which is not Unicode"
    elif isinstance(value, int) and not isinstance(value, bool):
        if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            return param, "is an integer outside the 64-bit range"
    elif isinstance(value, dict):
        for key, item in value.items():
            name = f"{param}.{key}" if param else str(key)
            found = _unforwardable(key, name, depth) or _unforwardable(item, name, depth + 1)
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _unforwardable(item, f"{param}[{i}]", depth + 1)
            if found is not None:
                return found
    return None


def _check_forwardable(raw: dict[str, Any]) -> None:
    """400 naming the field when the body cannot be forwarded as JSON (never a 502)."""
    try:
        orjson.dumps(raw)
    except TypeError:
        pass
    else:
        return
    found = _unforwardable(raw, "")
    param, what = found if found is not None else (None, "cannot be encoded as JSON")
    where = f"'{param}'" if param else "The request body"
    raise bad_request(
        f"Invalid value for {where}: it {what}." if param else f"{where} {what}.",
        param=param or None,
        code="invalid_value",
    )


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class ClientGone(Exception):
    """The client disconnected before the response started (or before its body ended)."""


async def _unless_disconnected(request: Request, coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro``, cancelling it if the client disconnects first (raise ClientGone).

    Starlette does not cancel a handler whose client went away; this does, so the
    backend request is closed (and a generation aborted) as soon as nobody waits for it.
    """
    work = asyncio.ensure_future(coro)
    watch = asyncio.ensure_future(_wait_disconnect(request.receive))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (work, watch):
            task.cancel()
        await asyncio.gather(work, watch, return_exceptions=True)
    if work.cancelled():
        raise ClientGone
    return work.result()


def _client_gone(info: dict[str, Any]) -> Response:
    info["outcome"] = "aborted"
    return Response(status_code=499)  # nginx's "client closed request": never seen by anyone


async def _serve(
    request: Request, endpoint: Endpoint, tenant: TenantConfig, header_tier: str | None
) -> Response:
    gw = _gw(request)
    info = _info(request)
    raw = await request.json()
    _check_forwardable(raw)
    _check_limits(raw, gw)
    tier = resolve_tier(gw.config, tenant, header_tier, raw.get("tokenpace"))
    info["tier"] = tier.name
    headers = tier.headers()
    model = raw["model"]
    info["model"] = model
    try:
        if not gw.router.knows_model(model):
            raise model_not_found(model)
        stream = bool(raw.get("stream"))
        ctx = RequestContext(
            request_id=info.get("request_id") or uuid.uuid4().hex,
            tenant=tenant.name,
            weight=tenant.weight,
            tier=tier,
            endpoint=endpoint,
            model=model,
            stream=stream,
            received_at=info.get("received_at") or time.monotonic(),
            expected_tokens=_expected_tokens(raw, gw),
        )
        admit = gw.admission.admit(ctx, tenant, estimate_prompt_tokens(raw))
        try:
            ticket = await _unless_disconnected(request, admit)
        except ClientGone:
            return _client_gone(info)
        ctx.backend = gw.admission.preferred(ticket.backend)
        headers = {
            **headers,
            **ticket.rate.headers(),
            **await gw.telemetry_tokens.header(ctx.request_id, tenant.name),
        }
        if stream:
            return await _serve_stream(request, gw, raw, ctx, info, headers, ticket)
        return await _serve_complete(request, gw, raw, ctx, info, headers, ticket)
    except GatewayError as exc:
        exc.headers = {**headers, **exc.headers}
        raise


async def _serve_stream(
    request: Request,
    gw: GatewayState,
    raw: dict[str, Any],
    ctx: RequestContext,
    info: dict[str, Any],
    headers: dict[str, str],
    ticket: Ticket,
) -> Response:
    tried: set[str] = set()
    try:
        attempt = await _unless_disconnected(request, open_attempt(gw, raw, ctx, tried, info))
    except BackendError as exc:
        await ticket.close()
        raise final_error(exc) from None
    except ClientGone:
        await ticket.close()
        return _client_gone(info)
    except BaseException:
        await ticket.close()
        raise
    relay = StreamRelay(gw, raw, ctx, attempt, tried, info, on_tokens=ticket.tokens)

    async def finish() -> None:
        """Once: the relay's teardown, its QoE record, the slot back (idempotent)."""
        await relay.finish()
        if not ticket.closed:
            gw.telemetry.record_stream(ctx, info)
            await ticket.close()

    async def body() -> AsyncIterator[bytes]:
        try:
            async for part in relay.events():
                yield part
        finally:
            await finish()

    try:
        return RelayResponse(
            body(),
            headers=headers,
            ping=0,  # the relay sends its own pings, only while it waits
            sep="\n",
            background=BackgroundTask(finish),
        )
    except BaseException:
        await finish()
        raise


class RelayResponse(EventSourceResponse):
    """sse-starlette's response, minus a cancel scope around every send.

    ``EventSourceResponse`` wraps each send in ``anyio.move_on_after(send_timeout)``,
    even without a timeout; on a relay that sends thousands of chunks a second that
    scope was a measurable share of the gateway's CPU per chunk (docs/benchmarks.md).
    """

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        if self.send_timeout is None:
            await send(message)
        else:
            await super()._send_with_timeout(send, message)


async def _serve_complete(
    request: Request,
    gw: GatewayState,
    raw: dict[str, Any],
    ctx: RequestContext,
    info: dict[str, Any],
    headers: dict[str, str],
    ticket: Ticket,
) -> Response:
    try:
        result = await _unless_disconnected(request, complete_with_failover(gw, raw, ctx, info))
    except ClientGone:
        return _client_gone(info)
    finally:
        ticket.tokens(int(info.get("tokens") or 0))
        await ticket.close()
    if info.get("tokens"):
        labels = (ctx.tenant, ctx.tier.name, info.get("backend", UNKNOWN))
        gw.metrics.tokens.labels(*labels).inc(info["tokens"])
    return JSONResponse(result, headers=headers)


def _add_routes(app: FastAPI) -> None:
    @app.post(
        "/v1/chat/completions",
        tags=["openai"],
        summary="Create a chat completion (OpenAI-compatible)",
        response_model=None,
        responses=_completion_responses(ChatCompletion),
    )
    async def chat_completions(
        request: Request,
        body: ChatCompletionRequest,
        tenant: Annotated[TenantConfig, Security(tenant_dependency)],
        x_tokenpace_tier: TierHeader = None,
    ) -> Response:
        return await _serve(request, "chat.completions", tenant, x_tokenpace_tier)

    @app.post(
        "/v1/completions",
        tags=["openai"],
        summary="Create a text completion (OpenAI-compatible)",
        response_model=None,
        responses=_completion_responses(Completion),
    )
    async def completions(
        request: Request,
        body: CompletionRequest,
        tenant: Annotated[TenantConfig, Security(tenant_dependency)],
        x_tokenpace_tier: TierHeader = None,
    ) -> Response:
        return await _serve(request, "completions", tenant, x_tokenpace_tier)

    @app.get(
        "/v1/models",
        tags=["openai"],
        summary="List the models the backends serve",
        response_model=ModelList,
        responses={401: _ERROR_RESPONSES[401], 503: _STORE_DOWN},
    )
    async def models(
        request: Request, tenant: Annotated[TenantConfig, Security(tenant_dependency)]
    ) -> ModelList:
        return ModelList(data=[Model(**card) for card in _gw(request).router.model_cards()])

    @app.get(
        "/healthz", tags=["ops"], summary="Liveness: the process serves HTTP", response_model=Health
    )
    async def healthz() -> Health:
        return Health(status="ok")

    @app.get(
        "/readyz",
        tags=["ops"],
        summary="Readiness: at least one backend is healthy",
        response_model=Health,
        responses={503: {"model": Health, "description": "No healthy backend"}},
    )
    async def readyz(request: Request) -> Response:
        router = _gw(request).router
        ready = router.any_healthy()
        body = Health(
            status="ready" if ready else "not ready",
            backends={s.name: s.healthy for s in router.states},
        )
        return JSONResponse(body.model_dump(), status_code=200 if ready else 503)

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
    async def metrics(request: Request) -> Response:
        gw = _gw(request)
        await gw.telemetry.refresh_metrics()
        payload, content_type = gw.metrics.render()
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
            **{k: _ERROR_RESPONSES[k] for k in (400, 401, 413)},
            403: {
                "model": ErrorResponse,
                "description": "The telemetry token is for another request, or already used",
            },
            404: {"model": ErrorResponse, "description": "Not a request id of this tenant"},
            409: {"model": ErrorResponse, "description": "The request was already reported"},
            429: {"model": ErrorResponse, "description": "Too many reports (Retry-After)"},
            503: _STORE_DOWN,
        },
        openapi_extra={
            "parameters": [
                {
                    "name": TOKEN_HEADER,
                    "in": "header",
                    "required": False,
                    "schema": {"type": "string"},
                    "description": "the request's telemetry token, instead of the API key "
                    "(or, text/plain for sendBeacon, as the body's 'telemetry_token')",
                }
            ],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _TELEMETRY_SCHEMA}},
            },
        },
    )
    async def telemetry(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
    ) -> JSONResponse:
        """With the API key, or the response's telemetry token (header, or in the body)."""
        gw = _gw(request)
        body = await request.body()
        auth = request.headers.get("authorization")
        try:
            if auth:  # the key BodyGate checked before reading the body
                tenant = await tenant_dependency(request, credentials)
                result = await gw.telemetry.report(tenant.name, body)
            else:
                check_size(body, gw.config.telemetry.max_body_bytes)
                sent = split_token(request.headers, body)
                if sent.token is None:
                    raise missing_credentials()
                claims = await gw.telemetry_tokens.verify(sent.token)
                _info(request)["tenant"] = claims.tenant
                result = await gw.telemetry.report(claims.tenant, sent.body, claims.request_id)
        except StoreUnavailable:
            raise store_unavailable() from None
        return JSONResponse(result, status_code=200 if result["stored"] else 202)

    @app.get(
        "/v1/tokenpace/qoe",
        tags=["tokenpace"],
        summary="QoE summary: client-side and gateway-side, per tier, over a window",
        responses={
            400: {"model": ErrorResponse, "description": "A bad query parameter"},
            401: _ERROR_RESPONSES[401],
            403: _ERROR_RESPONSES[403],
            503: _STORE_DOWN,
        },
    )
    async def qoe(
        request: Request,
        window: Annotated[
            int | None, Query(ge=1, description="seconds (default telemetry.window_s)")
        ] = None,
        tenant: Annotated[str | None, Query(description="one tenant (admin key only)")] = None,
    ) -> dict[str, Any]:
        gw = _gw(request)
        cfg = gw.config.telemetry
        window_s = min(window or cfg.window_s, cfg.retention_s)
        auth = request.headers.get("authorization")
        if not is_admin(gw, auth):
            caller = await authenticate(gw, auth)
            if tenant is not None and tenant != caller.name:
                raise forbidden("Only the admin key may read another tenant's QoE.", "tenant")
            tenant = caller.name
        try:
            return await gw.telemetry.summary(tenant, window_s)
        except StoreUnavailable:
            raise store_unavailable() from None


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, corrected to what the gateway does: 400 (not 422) on bad input,
    the tier header and the telemetry timelines as strict as the gateway checks them."""
    if app.openapi_schema:
        return app.openapi_schema
    config = app.state.gateway.config
    schema = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    for path in schema.get("paths", {}).values():
        for op in path.values():
            op.get("responses", {}).pop("422", None)
            for param in op.get("parameters", []):
                if param["name"] == TIER_HEADER:
                    param["schema"] = {"type": "string", "enum": sorted(config.tiers)}
    telemetry = schema["paths"][TELEMETRY_PATH]["post"]["requestBody"]["content"]
    telemetry["application/json"]["schema"] = _telemetry_schema(config.telemetry.max_points)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(_TELEMETRY_DEFS)
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    app.openapi_schema = schema
    return schema


def _telemetry_schema(max_points: int) -> dict[str, Any]:
    """The report's schema with the timeline checks of ``qos.timeline.token_times``."""
    out = copy.deepcopy(_TELEMETRY_SCHEMA)
    entry = {
        "type": "array",
        "prefixItems": [
            {"type": "number", "minimum": 0, "description": "seconds, non-decreasing"},
            {"type": "integer", "minimum": 1, "description": "tokens in the chunk"},
        ],
        "minItems": 2,
        "maxItems": 2,
    }
    for name in ("arrivals", "displayed"):
        prop = out["properties"][name]
        prop.update(items=entry, maxItems=max_points)
        prop["description"] += " (times non-decreasing)"
    return out


# ---------------------------------------------------------------------------------
# the factory


def create_app(config: GatewayConfig, *, backends: list[Backend] | None = None) -> FastAPI:
    """The gateway for ``config``.

    ``backends`` replaces the ones built from ``config.backends`` (to plug in-process
    engines or test doubles without a configuration entry). The app's lifespan starts
    the shared HTTP client, the backends and the health checks; serve it under an ASGI
    server that runs lifespan events (uvicorn does).
    """
    backend_list = list(backends) if backends is not None else build_backends(config)
    router = Router(backend_list, config)
    store = build_store(config)
    gw = GatewayState(
        config=config,
        backends=backend_list,
        router=router,
        metrics=GatewayMetrics(router),
        tenants={t.name: t for t in config.tenants},
        store=store,
        keys=KeyCache(store, config.store.key_cache_s),
    )
    gw.admission = AdmissionController(gw, store)
    gw.telemetry = Telemetry(gw)
    gw.telemetry_tokens = TelemetryTokens(gw)
    if isinstance(store, ResilientStore):
        store.on_reconnect = gw.admission.renew

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = build_http_client(config)
        gw.http = client
        runtime = BackendRuntime(http=client, config=config)
        started: list[Backend] = []
        health_task: asyncio.Task[None] | None = None
        try:
            await store.start()
            await store.seed_keys(
                {digest: t.name for digest, t in config.tenant_by_digest().items()},
                {t.name: t.model_dump_json(exclude={"api_keys"}) for t in config.tenants},
            )
            gw.admission.start()
            gw.telemetry.start()
            for b in backend_list:
                await b.start(runtime)
                started.append(b)
            await router.check_all()
            health_task = asyncio.create_task(router.health_loop(), name="tokenpace-health")
            gw.started = True
            log.info(
                "gateway ready: %d backend(s), %d healthy",
                len(backend_list),
                sum(s.healthy for s in router.states),
            )
            yield
        finally:
            gw.started = False
            if health_task is not None:
                health_task.cancel()
                await asyncio.gather(health_task, return_exceptions=True)
            for b in reversed(started):
                try:
                    await b.aclose()
                except Exception:
                    log.warning("closing backend %s failed", b.name, exc_info=True)
            await gw.admission.aclose()
            await gw.telemetry.aclose()
            await store.aclose()
            await client.aclose()
            gw.http = None

    app = FastAPI(
        title="tokenpace gateway",
        version="0.1.0",
        description=(
            "OpenAI-compatible front door with QoE tiers. Choose a tier with the "
            "`X-TokenPace-Tier` header or the body's `tokenpace` field; see "
            "docs/protocol.md."
        ),
        lifespan=lifespan,
        # server.docs: false turns off the interactive docs and the document they read
        **({} if config.server.docs else dict.fromkeys(("docs_url", "redoc_url", "openapi_url"))),
    )
    app.state.gateway = gw
    install_error_handlers(app, auth_first=_auth_for_validation)
    _add_routes(app)
    add_admin_routes(app)
    add_status_route(app)
    add_page_routes(app)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    app.add_middleware(BodyGate, gw=gw)  # inside CORS: its 401 and 413 carry CORS headers
    if config.cors.allow_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=config.cors.allow_origins,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", TIER_HEADER, TOKEN_HEADER],
            expose_headers=[
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
            ],
        )
    # Outermost, around Starlette's ServerErrorMiddleware too, so that even a 500 carries
    # X-Request-Id and is counted.
    build_stack = app.build_middleware_stack
    app.build_middleware_stack = lambda: GatewayMiddleware(build_stack(), gw)  # type: ignore[method-assign]
    return app
