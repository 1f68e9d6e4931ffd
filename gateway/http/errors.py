"""The HTTP layer's own error answers (an unknown route, a body past its limit) and the
handlers that answer every error in OpenAI's shape. Every error answer goes through
:func:`answer` or :func:`respond`, which leave its code on the request's record (the
access log line says why a request failed)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.config.schema import TenantConfig
from gateway.context import request_record
from gateway.errors import INVALID_REQUEST, SERVER_ERROR, GatewayError, validation_error
from gateway.store import StoreUnavailable, store_unavailable

log = logging.getLogger("tokenpace.gateway")

COMPLETION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
# A completion request refused before admission, and the answer it gets for it
# (:meth:`gateway.admission.controller.AdmissionController.refused`).
Refused = Callable[[TenantConfig, GatewayError], Awaitable[GatewayError]]


def not_found(method: str, path: str) -> GatewayError:
    return GatewayError(
        404, f"Invalid URL ({method} {path})", type=INVALID_REQUEST, code="unknown_url"
    )


def too_large(limit: int) -> GatewayError:
    return GatewayError(
        413,
        f"Request body too large: the limit is {limit} bytes.",
        code="request_too_large",
    )


def respond(scope: Scope, error: GatewayError, headers: dict[str, str] | None = None) -> Response:
    """``error``'s response, its code (else its type) left on the request's record."""
    body = error.body.get("error")
    if isinstance(body, dict):
        request_record(scope).error_code = str(body.get("code") or body.get("type") or "")
    return error.response(headers)


async def answer(error: GatewayError, scope: Scope, receive: Receive, send: Send) -> None:
    """Send ``error``'s response (:func:`respond`) from a middleware."""
    await respond(scope, error)(scope, receive, send)


def install_error_handlers(app: FastAPI, refused: Refused) -> None:
    """Answer every error in OpenAI's shape (a validation error only ever reaches an
    authenticated request: :class:`~gateway.http.gate.AccessGate` runs first); a
    completion request that fails validation is ``refused``."""

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> Response:
        return respond(request.scope, exc)

    @app.exception_handler(StoreUnavailable)
    async def _store_down(request: Request, exc: StoreUnavailable) -> Response:
        return respond(request.scope, store_unavailable(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        err = validation_error(exc.errors())
        caller = request_record(request.scope).caller
        if request.url.path in COMPLETION_PATHS and caller and caller.tenant:
            err = await refused(caller.tenant, err)
        return respond(request.scope, err)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        headers = dict(exc.headers or {})
        if exc.status_code == 404:
            err = not_found(request.method, request.url.path)
        elif exc.status_code == 405:
            err = GatewayError(
                405,
                f"Method not allowed ({request.method} {request.url.path})",
                code="method_not_allowed",
            )
        else:
            err = GatewayError(exc.status_code, str(exc.detail))
        return respond(request.scope, err, headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error", exc_info=exc)
        err = GatewayError(
            500, "The gateway had an internal error.", type=SERVER_ERROR, code="internal_error"
        )
        return respond(request.scope, err)
