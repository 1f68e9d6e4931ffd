"""The HTTP layer's own error answers (an unknown route, a body past its limit) and the
handlers that answer every error in OpenAI's shape."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from gateway.errors import INVALID_REQUEST, SERVER_ERROR, GatewayError, validation_error
from gateway.store import StoreUnavailable, store_unavailable

log = logging.getLogger("tokenpace.gateway")


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


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error in OpenAI's shape (a validation error only ever reaches an
    authenticated request: :class:`~gateway.http.gate.AccessGate` runs first)."""

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> Response:
        return exc.response()

    @app.exception_handler(StoreUnavailable)
    async def _store_down(request: Request, exc: StoreUnavailable) -> Response:
        return store_unavailable(exc).response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        return validation_error(exc.errors()).response()

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
        return err.response(headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error", exc_info=exc)
        return GatewayError(
            500, "The gateway had an internal error.", type=SERVER_ERROR, code="internal_error"
        ).response()
