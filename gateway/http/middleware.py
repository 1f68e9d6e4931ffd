"""The outermost middleware: what every HTTP request gets, whatever its route.

:class:`GatewayMiddleware`: the request's :class:`~gateway.context.RequestRecord` (id,
receipt time), the ``X-Request-Id`` and ``X-Content-Type-Options: nosniff`` response
headers, the request counter, the in-flight gauge, the access log line, and ``/metrics``
only on its port (``metrics.port``). Who may call a route is
:class:`~gateway.http.gate.AccessGate`'s.
"""

from __future__ import annotations

import logging
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.config.schema import MetricsConfig
from gateway.context import RECORD_KEY, SERVER_SEND_KEY, RequestRecord
from gateway.errors import GatewayError
from gateway.http.auth import METRICS_PATH
from gateway.http.errors import answer, not_found
from gateway.telemetry.logs import request_id_var
from gateway.telemetry.metrics import GatewayMetrics, series

access_log = logging.getLogger("tokenpace.gateway.access")

NOSNIFF = (b"x-content-type-options", b"nosniff")  # a body is only ever what it says
OWN = {b"x-request-id", NOSNIFF[0]}  # the headers this middleware sets on every response
API_ENDPOINTS = {
    "/v1/chat/completions": "chat.completions",
    "/v1/completions": "completions",
    "/v1/models": "models",
    "/v1/tokenpace/telemetry": "telemetry",
}


class GatewayMiddleware:
    """Request id, receipt time, X-Request-Id, request metrics, access log; ``/metrics``
    only on its own port, when ``metrics.port`` is set.

    Every middleware of the stack (this one, CORS, Starlette's error handlers) acts on a
    response's start alone and passes its body messages through unchanged; the server's
    ``send`` is left in the scope (:func:`server_send`) so that a streamed body can skip
    their wrappers, one call per chunk instead of one per middleware.

    Request ids are 32 random hex digits, the first ones replaced by ``id_prefix`` (a
    worker's holder tag, :mod:`gateway.runtime.holders`).
    """

    def __init__(
        self, app: ASGIApp, metrics: GatewayMetrics, cfg: MetricsConfig, id_prefix: str = ""
    ) -> None:
        self.app = app
        self.cfg = cfg
        self.id_prefix = id_prefix
        self._in_flight = series(metrics.in_flight)
        self._requests = series(metrics.requests)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        received_at = time.monotonic()
        request_id = self.id_prefix + uuid.uuid4().hex[len(self.id_prefix) :]
        token = request_id_var.set(request_id)
        record = RequestRecord(request_id, received_at)
        state = scope.setdefault("state", {})
        state[RECORD_KEY] = record
        state[SERVER_SEND_KEY] = send
        path = scope.get("path", "")
        endpoint = API_ENDPOINTS.get(path)
        status = 500
        own_headers = [(b"x-request-id", request_id.encode()), NOSNIFF]

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [h for h in message.get("headers", []) if h[0].lower() not in OWN]
                message = {**message, "headers": [*headers, *own_headers]}
            await send(message)

        gauge = self._in_flight(endpoint) if endpoint else None
        if gauge is not None:
            gauge.inc()
        try:
            refusal = self._port_refusal(scope, path)
            if refusal is not None:
                await answer(refusal, scope, receive, send_with_id)
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

    def _port_refusal(self, scope: Scope, path: str) -> GatewayError | None:
        """404 for ``/metrics`` off the metrics port, and for anything else on it."""
        cfg = self.cfg
        if cfg.port is not None:
            server = scope.get("server") or (None, None)
            on_metrics_port = server[1] == cfg.port
            if on_metrics_port != (path == METRICS_PATH):
                return not_found(scope.get("method", "GET"), path)
        return None
