"""OpenAI-shaped errors: the body, the exception the gateway raises, and the shapes every
part of it builds its answers from (each domain's own errors live with it: admission's,
telemetry's, the backends', the HTTP layer's).

Every error the gateway returns has OpenAI's body,
``{"error": {"message", "type", "param", "code"}}``, so unmodified OpenAI clients raise
their usual exception classes (``AuthenticationError`` for 401, ``BadRequestError`` for
400, ``PermissionDeniedError`` for 403, ``NotFoundError`` for 404, ...).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.responses import JSONResponse

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


def invalid_json() -> GatewayError:
    """A body that is not JSON: OpenAI's answer, word for word."""
    return bad_request(
        "We could not parse the JSON body of your request. (HINT: This likely means you "
        "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, "
        "but what was sent was not valid JSON.)",
        code="invalid_json",
    )


def empty_body() -> GatewayError:
    """A request that needs a JSON object sent none."""
    return bad_request("The request body is empty; a JSON object is required.")


def not_an_object() -> GatewayError:
    """A body that is JSON but not the object the request needs."""
    return bad_request("The request body must be a JSON object.", code="invalid_type")


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
        return invalid_json()
    if param is None:
        if kind == "missing":
            return empty_body()
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
