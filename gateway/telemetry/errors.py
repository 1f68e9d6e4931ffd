"""Telemetry's answers: a report too large (413) or too frequent (429), about a request
not the caller's (404) or already reported (409); a telemetry token that is not valid,
or no credential at all (401); too many reports without a credential being read (503)."""

from __future__ import annotations

from gateway.errors import RATE_LIMIT, SERVER_ERROR, GatewayError, unauthorized
from gateway.store.ratelimit import retry_after_header


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


def anonymous_bodies_busy(limit: int) -> GatewayError:
    """503 when the bodies of reports without a credential already hold ``limit`` bytes."""
    return GatewayError(
        503,
        f"Too many telemetry reports without a credential are being read (at most {limit} "
        "bytes of them at once); try again shortly, or send the report with its token in "
        "the X-TokenPace-Telemetry-Token header.",
        type=SERVER_ERROR,
        code="server_busy",
        headers={"Retry-After": "1"},
    )
