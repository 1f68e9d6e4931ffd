"""OpenAI-shaped errors: the body, the exception the gateway raises, every answer it
gives as an error (the factories below), and the handlers.

Every error the gateway returns has OpenAI's body,
``{"error": {"message", "type", "param", "code"}}``, so unmodified OpenAI clients raise
their usual exception classes (``AuthenticationError`` for 401, ``BadRequestError`` for
400, ``PermissionDeniedError`` for 403, ``NotFoundError`` for 404, ...).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from gateway.store import StoreUnavailable
from gateway.store.ratelimit import RateState, retry_after_header

if TYPE_CHECKING:
    from gateway.backends import BackendError

log = logging.getLogger("tokenpace.gateway")

INVALID_REQUEST = "invalid_request_error"
PERMISSION = "permission_error"
RATE_LIMIT = "rate_limit_error"
SERVER_ERROR = "server_error"
UPSTREAM_ERROR = "upstream_error"
TIMEOUT = "timeout_error"


def error_body(
    message: str, type: str = INVALID_REQUEST, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error body."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class GatewayError(Exception):
    """An error answered with OpenAI's body and ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        self._body = body

    @property
    def body(self) -> dict[str, Any]:
        """The error body (an upstream's own OpenAI-shaped body is relayed as it was)."""
        if self._body is not None:
            return self._body
        return error_body(self.message, self.type, self.param, self.code)

    def response(self, headers: Mapping[str, str] | None = None) -> JSONResponse:
        return JSONResponse(
            self.body, status_code=self.status, headers={**self.headers, **(headers or {})}
        )


def bad_request(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


def unauthorized(message: str) -> GatewayError:
    return GatewayError(
        401,
        message,
        type=INVALID_REQUEST,
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def forbidden(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(403, message, type=PERMISSION, param=param, code=code)


def model_not_found(model: str) -> GatewayError:
    # OpenAI's exact wording and code for an unknown model.
    return GatewayError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        type=INVALID_REQUEST,
        param="model",
        code="model_not_found",
    )


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


def store_unavailable() -> GatewayError:
    """The shared store is unreachable (fail closed)."""
    return GatewayError(
        503,
        "The gateway's shared state is unavailable; try again shortly.",
        type=SERVER_ERROR,
        code="store_unavailable",
        headers={"Retry-After": "1"},
    )


def final_error(exc: BackendError) -> GatewayError:
    """The answer to the client when a backend's failure ends the request."""
    headers = {}
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    return GatewayError(exc.status, exc.message, body=exc.body, headers=headers)


# -- admission: limits, budget, the queue ---------------------------------------------


def rate_limited(limited_by: str | None, retry_after_ms: float, rate: RateState) -> GatewayError:
    """429 for a rate limit (``requests``, ``tokens``) or the token ``budget``."""
    by = limited_by or "requests"
    headers = rate.headers()
    if retry_after_ms >= 0:
        headers.update(retry_after_header(retry_after_ms))
    if by == "budget":
        return GatewayError(
            429,
            "You exceeded your token budget for this period; see Retry-After.",
            type="insufficient_quota",
            code="insufficient_quota",
            headers=headers,
        )
    what = "requests" if by == "requests" else "tokens"
    never = " (this request alone is larger than the limit)" if retry_after_ms < 0 else ""
    return GatewayError(
        429,
        f"Rate limit reached for {what} per minute{never}; see Retry-After.",
        type=RATE_LIMIT,
        code=f"rate_limit_{what}",
        headers=headers,
    )


def queue_full(max_queued: int | None, retry_after_ms: float, rate: RateState) -> GatewayError:
    return GatewayError(
        429,
        f"Too many requests of yours are waiting (at most {max_queued}); retry shortly.",
        type=RATE_LIMIT,
        code="queue_full",
        headers={**rate.headers(), **retry_after_header(retry_after_ms)},
    )


def queue_timeout(max_wait_s: float) -> GatewayError:
    return GatewayError(
        503,
        f"The request waited {max_wait_s:g} s in the gateway's queue; try again later.",
        type=SERVER_ERROR,
        code="queue_timeout",
        headers={"Retry-After": "1"},
    )


# -- telemetry --------------------------------------------------------------------------


def report_too_large(limit: int) -> GatewayError:
    return GatewayError(
        413,
        f"Telemetry report too large: the limit is {limit} bytes.",
        code="request_too_large",
    )


def too_many_reports(per_minute: int, retry_after_ms: float) -> GatewayError:
    return GatewayError(
        429,
        f"Too many telemetry reports (at most {per_minute} a minute).",
        type=RATE_LIMIT,
        code="rate_limit_exceeded",
        headers=retry_after_header(retry_after_ms),
    )


def unknown_request(request_id: str) -> GatewayError:
    return GatewayError(
        404,
        f"No request {request_id} of yours is known to this gateway.",
        param="request_id",
        code="request_not_found",
    )


def duplicate_report(request_id: str) -> GatewayError:
    return GatewayError(
        409,
        f"Request {request_id} was already reported.",
        param="request_id",
        code="duplicate_report",
    )


def invalid_token(message: str, param: str) -> GatewayError:
    """401 for a telemetry token that is forged, malformed or expired."""
    return GatewayError(
        401, message, type="authentication_error", param=param, code="invalid_telemetry_token"
    )


def missing_telemetry_credentials(header: str, body_field: str) -> GatewayError:
    return unauthorized(
        "A telemetry report needs the API key (Authorization: Bearer YOUR_KEY) or the "
        f"response's telemetry token (the {header} header, or '{body_field}' in the "
        "JSON body)."
    )


# -- administration and pages -----------------------------------------------------------


def tenant_not_found(name: str) -> GatewayError:
    return GatewayError(404, f"No tenant {name!r}.", param="tenant", code="tenant_not_found")


def key_not_found(key_id: str) -> GatewayError:
    return GatewayError(404, f"No live key {key_id} for this tenant.", param="key_id")


def pages_not_built(directory: str) -> GatewayError:
    return GatewayError(
        503,
        f"The web pages are not built ({directory} has none): run `make webui`, which runs "
        "npm ci and the build in webui/.",
        type=SERVER_ERROR,
        code="webui_not_built",
    )


def sse_error_event(body: dict[str, Any]) -> bytes:
    """An OpenAI-style in-stream error event (the openai client raises ``APIError``)."""
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


# ---------------------------------------------------------------------------------
# validation errors -> 400 with ``param``

_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "None"}


def _param_from_loc(loc: tuple[Any, ...]) -> str | None:
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "header", "path"):
        parts = parts[1:]
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        text = str(part)
        if text in _TYPE_TAGS or "[" in text or "-" in text:
            continue  # a union branch or validator tag, not a field
        out += ("." if out else "") + text
    return out or None


def validation_error(errors: Sequence[Mapping[str, Any]]) -> GatewayError:
    """Turn pydantic/FastAPI validation errors into one OpenAI 400 (like OpenAI: the first)."""
    if not errors:
        return bad_request("Invalid request body.")
    err = errors[0]
    kind = err.get("type", "")
    param = _param_from_loc(tuple(err.get("loc", ())))
    msg = str(err.get("msg", "invalid value"))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if kind == "json_invalid":
        return bad_request(
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, "
            "but what was sent was not valid JSON.)",
            code="invalid_json",
        )
    if param is None:
        if kind == "missing":
            return bad_request("The request body is empty; a JSON object is required.")
        return bad_request(f"The request body must be a JSON object ({msg}).", code="invalid_type")
    if kind == "missing":
        return bad_request(
            f"Missing required parameter: '{param}'.",
            param=param,
            code="missing_required_parameter",
        )
    if kind == "extra_forbidden":
        return bad_request(
            f"Unrecognized request argument supplied: '{param}'.",
            param=param,
            code="unknown_parameter",
        )
    code = (
        "invalid_type" if kind.endswith("_type") or kind.endswith("_parsing") else "invalid_value"
    )
    return bad_request(f"Invalid value for '{param}': {msg}.", param=param, code=code)


ValidationAuthHook = Callable[[Request], Awaitable[None]]


def install_error_handlers(app: FastAPI, auth_first: ValidationAuthHook | None = None) -> None:
    """Answer every error in OpenAI's shape.

    ``auth_first`` runs before a validation error is reported, so a request that is both
    unauthenticated and malformed gets 401 (FastAPI parses the body before running the
    authentication dependency).
    """

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> Response:
        return exc.response()

    @app.exception_handler(StoreUnavailable)
    async def _store_down(request: Request, exc: StoreUnavailable) -> Response:
        return store_unavailable().response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        if auth_first is not None:
            try:
                await auth_first(request)
            except GatewayError as auth_exc:
                return auth_exc.response()
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
