"""The OpenAPI document: the responses each route documents, and FastAPI's document
corrected to what the gateway does (400, not 422; the tier header's values; the
completion bodies and the telemetry report's schema, which are read raw)."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from gateway.http.auth import TELEMETRY_PATH
from gateway.request.schemas import ChatCompletionRequest, CompletionRequest, ErrorResponse
from gateway.request.tiers import TIER_HEADER
from gateway.telemetry.reports import MAX_TIMELINE_S, TelemetryReport
from gateway.telemetry.tokens import TOKEN_HEADER
from qos.signals import MAX_BUFFER_TOKENS, MAX_PACE_TPS, MAX_REQUEST_ID_CHARS, Presence

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Malformed JSON, a bad field, an unknown tier"},
    401: {"model": ErrorResponse, "description": "Missing or unknown API key"},
    403: {"model": ErrorResponse, "description": "Tier (or custom tier) outside the plan"},
    404: {"model": ErrorResponse, "description": "Unknown model (code model_not_found)"},
    413: {"model": ErrorResponse, "description": "Body larger than limits.max_body_bytes"},
    429: {"model": ErrorResponse, "description": "A rate limit, budget or queue bound"},
    502: {"model": ErrorResponse, "description": "Every backend failed"},
    503: {
        "model": ErrorResponse,
        "description": "No engine can start the request within its tier's bound "
        "(overloaded), every backend is down (backend_unavailable), the queue wait ran "
        "out (queue_timeout) or the shared store is unreachable (store_unavailable); "
        "Retry-After",
    },
    504: {"model": ErrorResponse, "description": "The backend timed out"},
}
STORE_DOWN: dict[str, Any] = {
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

# The completion bodies are read and validated by the handlers (gateway.request.body),
# so their schemas, like the telemetry report's, are given to the document by hand.
_COMPLETION_REFS, _COMPLETION_DEFS = models_json_schema(
    [(ChatCompletionRequest, "validation"), (CompletionRequest, "validation")],
    ref_template="#/components/schemas/{model}",
)


def completion_request(model: type[BaseModel]) -> dict[str, Any]:
    """A completion route's ``openapi_extra``: its body, ``model``, and the tier header."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _COMPLETION_REFS[(model, "validation")]}},
        },
        "parameters": [
            {
                "name": TIER_HEADER,
                "in": "header",
                "required": False,
                "schema": {"type": "string"},
                "description": "QoE tier for this request (or use the body's `tokenpace.tier`)",
            }
        ],
    }


# The telemetry body is read raw (size limit and authentication before parsing), so its
# schema is given to the OpenAPI document by hand.
TELEMETRY_SCHEMA = TelemetryReport.model_json_schema(ref_template="#/components/schemas/{model}")
_TELEMETRY_DEFS = TELEMETRY_SCHEMA.pop("$defs", {})

READER_SIGNAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "What the reader of a stream is doing (qos.signals.ReaderSignal)",
    "required": ["request_id", "presence"],
    "properties": {
        "request_id": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_REQUEST_ID_CHARS,
            "description": "the stream's X-Request-Id",
        },
        "presence": {"type": "string", "enum": [p.value for p in Presence]},
        "pace_tps": {
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "maximum": MAX_PACE_TPS,
            "description": "the reader's own pace (tokens/s), when it differs from the tier's",
        },
        "buffer_tokens": {
            "type": ["integer", "null"],
            "minimum": 0,
            "maximum": MAX_BUFFER_TOKENS,
            "description": "tokens received and not yet shown or spoken",
        },
        "telemetry_token": {
            "type": "string",
            "description": "the response's telemetry token (sendBeacon: no headers)",
        },
    },
}


def completion_responses(model: type) -> dict[int | str, dict[str, Any]]:
    return {
        200: {
            "model": model,
            "description": "The completion; or, with `stream: true`, its chunks. " + _SSE_DOC,
            "headers": _TP_HEADERS,
            "content": {"text/event-stream": {"schema": _SSE_EVENT}},
        },
        **ERROR_RESPONSES,
    }


def openapi_document(app: FastAPI, tiers: Iterable[str], max_points: int) -> dict[str, Any]:
    """FastAPI's document, corrected to what the gateway does: 400 (not 422) on bad input,
    the tier header and the telemetry timelines as strict as the gateway checks them."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    for path in schema.get("paths", {}).values():
        for op in path.values():
            op.get("responses", {}).pop("422", None)
            for param in op.get("parameters", []):
                if param["name"] == TIER_HEADER:
                    param["schema"] = {"type": "string", "enum": sorted(tiers)}
    telemetry = schema["paths"][TELEMETRY_PATH]["post"]["requestBody"]["content"]
    telemetry["application/json"]["schema"] = _telemetry_schema(max_points)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(_TELEMETRY_DEFS)
    components.update(_COMPLETION_DEFS["$defs"])
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    app.openapi_schema = schema
    return schema


def _telemetry_schema(max_points: int) -> dict[str, Any]:
    """The report's schema with the timeline checks of ``qos.timeline.token_times``."""
    out = copy.deepcopy(TELEMETRY_SCHEMA)
    entry = {
        "type": "array",
        "prefixItems": [
            {
                "type": "number",
                "minimum": 0,
                "maximum": MAX_TIMELINE_S,
                "description": "seconds since the request, non-decreasing",
            },
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
