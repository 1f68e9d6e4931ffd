"""The gateway's two pure-ASGI middlewares.

- :class:`GatewayMiddleware`, outermost: the request's :class:`~gateway.context.RequestRecord`
  (id, receipt time), the ``X-Request-Id`` response header, the request counter, the
  in-flight gauge, the access log line, and who may read ``/metrics``.
- :class:`BodyGate`, inside CORS: authentication from the headers before the body is
  read, then the body within its limit (413 before it is parsed).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.config.schema import LimitsConfig, MetricsConfig, TelemetryConfig
from gateway.context import RECORD_KEY, SERVER_SEND_KEY, RequestRecord, request_record
from gateway.errors import GatewayError, unauthorized
from gateway.http.admin import ADMIN_PREFIX
from gateway.http.auth import Authenticator, matches
from gateway.http.errors import not_found, too_large
from gateway.request.disconnect import ClientGone
from gateway.store import StoreUnavailable, store_unavailable
from gateway.telemetry.logs import request_id_var
from gateway.telemetry.metrics import GatewayMetrics, series

access_log = logging.getLogger("tokenpace.gateway.access")

TELEMETRY_PATH = "/v1/tokenpace/telemetry"
METRICS_PATH = "/metrics"
API_ENDPOINTS = {
    "/v1/chat/completions": "chat.completions",
    "/v1/completions": "completions",
    "/v1/models": "models",
    "/v1/tokenpace/telemetry": "telemetry",
}
_BODY_METHODS = {"POST", "PUT", "PATCH"}


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


class GatewayMiddleware:
    """Request id, receipt time, X-Request-Id, request metrics, access log; ``/metrics``
    only where ``metrics`` allows it (its own port, or its token).

    Every middleware of the stack (this one, CORS, Starlette's error handlers) acts on a
    response's start alone and passes its body messages through unchanged; the server's
    ``send`` is left in the scope (:func:`server_send`) so that a streamed body can skip
    their wrappers, one call per chunk instead of one per middleware.
    """

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics, cfg: MetricsConfig) -> None:
        self.app = app
        self.cfg = cfg
        self._in_flight = series(metrics.in_flight)
        self._requests = series(metrics.requests)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        received_at = time.monotonic()
        request_id = uuid.uuid4().hex
        token = request_id_var.set(request_id)
        record = RequestRecord(request_id, received_at)
        state = scope.setdefault("state", {})
        state[RECORD_KEY] = record
        state[SERVER_SEND_KEY] = send
        path = scope.get("path", "")
        endpoint = API_ENDPOINTS.get(path)
        status = 500
        rid_header = (b"x-request-id", request_id.encode())

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [h for h in message.get("headers", []) if h[0].lower() != b"x-request-id"]
                message = {**message, "headers": [*headers, rid_header]}
            await send(message)

        gauge = self._in_flight(endpoint) if endpoint else None
        if gauge is not None:
            gauge.inc()
        try:
            refusal = self._metrics_refusal(scope, path)
            if refusal is not None:
                await refusal.response()(scope, receive, send_with_id)
                return
            await self.app(scope, receive, send_with_id)
        finally:
            if gauge is not None:
                gauge.dec()
            if endpoint is not None:
                self.finished(endpoint, status, record)
            request_id_var.reset(token)

    def finished(self, endpoint: str, status: int, record: RequestRecord) -> None:
        """Count the request and write its access log line."""
        outcome = record.outcome or ("completed" if status < 400 else "error")
        if status == 499:
            outcome = "aborted"
        labels = (
            record.tenant_name,
            record.tier,
            record.backend,
            endpoint,
            str(status),
            outcome,
        )
        self._requests(*labels).inc()
        if endpoint == "models" or not access_log.isEnabledFor(logging.INFO):
            return
        extra = record.log_fields()
        extra.update(endpoint=endpoint, status=status, outcome=outcome)
        extra["duration_s"] = round(time.monotonic() - record.received_at, 6)
        access_log.info("request finished", extra=extra)

    def _metrics_refusal(self, scope: Scope, path: str) -> GatewayError | None:
        """Why this request may not have ``/metrics`` (or, on the metrics port, anything else)."""
        cfg = self.cfg
        if cfg.port is not None:
            server = scope.get("server") or (None, None)
            on_metrics_port = server[1] == cfg.port
            if on_metrics_port != (path == METRICS_PATH):
                return not_found(scope.get("method", "GET"), path)
        if (
            path == METRICS_PATH
            and cfg.token_sha256 is not None
            and not matches(header(scope, b"authorization"), cfg.token_sha256)
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

    def __init__(
        self,
        app: ASGIApp,
        auth: Authenticator,
        limits: LimitsConfig,
        telemetry: TelemetryConfig,
    ) -> None:
        self.app = app
        self.auth = auth
        self.max_body = limits.max_body_bytes
        self.max_report = min(limits.max_body_bytes, telemetry.max_body_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        auth = header(scope, b"authorization")
        limit = self.max_report if path == TELEMETRY_PATH else self.max_body
        try:
            if path.startswith(ADMIN_PREFIX):
                if not self.auth.is_admin(auth):
                    raise unauthorized("This route needs the gateway's admin key.")
            elif path == TELEMETRY_PATH and not auth:
                pass  # the report's own credential, if any, is inside the body
            elif path in API_ENDPOINTS:
                request_record(scope).authenticated(await self.auth.tenant(auth))
            else:
                await self.app(scope, receive, send)  # no such route: the body is never read
                return
        except GatewayError as exc:
            await exc.response()(scope, receive, send)
            return
        except StoreUnavailable:
            await store_unavailable().response()(scope, receive, send)
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
    length = header(scope, b"content-length")
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
