"""A completion request's body: within the configured caps, and writable by the upstream's
JSON encoder (400 naming the field otherwise, never a 502 from every backend)."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.config.schema import LimitsConfig
from gateway.errors import bad_request
from gateway.request.schemas import ChatCompletionRequest, CompletionRequest


def check_limits(body: ChatCompletionRequest | CompletionRequest, limits: LimitsConfig) -> None:
    """400 for a body past the configured caps (max_tokens, n, best_of)."""
    for key in ("max_tokens", "max_completion_tokens"):
        value = getattr(body, key, None)
        if value is not None and value > limits.max_tokens:
            raise bad_request(
                f"Invalid value for '{key}': {value} is larger than this gateway's limit "
                f"of {limits.max_tokens}.",
                param=key,
                code="invalid_value",
            )
    for key in ("n", "best_of"):
        value = getattr(body, key, None)
        if value is not None and value > limits.max_n:
            raise bad_request(
                f"Invalid value for '{key}': at most {limits.max_n}.",
                param=key,
                code="invalid_value",
            )
    if body.stream_options is not None and not body.stream:
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


def check_forwardable(raw: dict[str, Any]) -> None:
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
