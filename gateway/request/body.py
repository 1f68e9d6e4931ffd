"""A completion request's body: parsed and validated, of a shape whose parse and
validation cost is bounded, within the configured caps, and writable by the upstream's
JSON encoder (400 naming the field otherwise, never a 502 from every backend)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import orjson
from pydantic import ValidationError

from gateway.config.schema import LimitsConfig
from gateway.errors import bad_request, empty_body, invalid_json, not_an_object, validation_error
from gateway.request.schemas import ChatCompletionRequest, CompletionRequest

# A body up to this size that is not strict JSON is left to the parser, which names the
# field (a few milliseconds at worst); a larger one is refused (check_shape).
STRICT_JSON_BYTES = 64 * 1024
_NOTHING = msgspec.Raw(b"")


class _Body(msgspec.Struct):
    """The arrays of a request whose items the validation builds one object each for."""

    messages: msgspec.Raw = _NOTHING
    tools: msgspec.Raw = _NOTHING


class _Message(msgspec.Struct):
    content: msgspec.Raw = _NOTHING
    tool_calls: msgspec.Raw = _NOTHING


_BODY = msgspec.json.Decoder(_Body)
_MESSAGE = msgspec.json.Decoder(_Message)
_ITEMS = msgspec.json.Decoder(list[msgspec.Raw])


def _items(raw: msgspec.Raw) -> list[msgspec.Raw]:
    """The items of ``raw`` when it is a JSON array, else none (the validation says why)."""
    return _ITEMS.decode(raw) if memoryview(raw)[:1] == b"[" else []


def check_shape(body: bytes, max_messages: int, max_parts: int) -> None:
    """400 for a chat body of more than ``max_messages`` messages, or more than
    ``max_parts`` content parts, tool calls and tools together, counted on the bytes
    before anything is parsed (msgspec passes that build one small object per item).

    Validating 120,000 messages held the event loop, and every stream on it, for about
    0.4 s; counting them takes milliseconds. The count reads strict JSON (RFC 8259: no
    NaN, no lone surrogate): a body of more than :data:`STRICT_JSON_BYTES` that is not
    is refused, a smaller one left to the parser and the validation, which name the field.
    """
    try:
        top = _BODY.decode(body)
        messages = _items(top.messages)
        if len(messages) > max_messages:
            raise bad_request(
                f"Invalid value for 'messages': {len(messages)} messages; this gateway "
                f"accepts at most {max_messages} for your plan.",
                param="messages",
                code="too_many_messages",
            )
        parts = len(_items(top.tools))
        for message in messages:
            if memoryview(message)[:1] == b"{":
                m = _MESSAGE.decode(message)
                parts += len(_items(m.content)) + len(_items(m.tool_calls))
    except msgspec.ValidationError:
        raise not_an_object() from None
    except msgspec.DecodeError:
        if len(body) <= STRICT_JSON_BYTES:
            return
        raise bad_request(
            "We could not parse the JSON body of your request: a body larger than "
            f"{STRICT_JSON_BYTES} bytes must be strict JSON (RFC 8259: no NaN or Infinity, "
            "no lone surrogate).",
            code="invalid_json",
        ) from None
    if parts > max_parts:
        raise bad_request(
            f"Invalid request: {parts} content parts, tool calls and tools together; this "
            f"gateway accepts at most {max_parts}.",
            param="messages",
            code="too_many_parts",
        )


Completion = ChatCompletionRequest | CompletionRequest


def parse_body(
    body: bytes, model: type[ChatCompletionRequest] | type[CompletionRequest]
) -> tuple[dict[str, Any], Completion]:
    """The body as the client wrote it (Python's JSON parser, as FastAPI's: the base of
    the upstream body, unknown fields, number formats and key order untouched) and the
    same validated by ``model``; 400 naming the first field at fault otherwise
    (:func:`~gateway.errors.validation_error`), FastAPI's answer to a body parameter word
    for word, but for JSON that is not an object, which gets the shape check's message.
    Done in the handler, the route solves no dependency per request."""
    if not body:
        raise empty_body()
    try:
        raw = json.loads(body)
    except json.JSONDecodeError:
        raise invalid_json() from None
    if not isinstance(raw, dict):
        raise not_an_object()
    try:
        return raw, model.model_validate(raw)
    except ValidationError as exc:
        raise validation_error(exc.errors(include_url=False)) from None


def check_limits(body: Completion, limits: LimitsConfig) -> None:
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


_INT_RANGE = (-(2**63), 2**64 - 1)  # orjson's integers: signed or unsigned 64-bit


def _unforwardable(value: Any, param: str) -> tuple[str, str] | None:
    """The first value the upstream body cannot carry: ``(param, what is wrong)``.

    Python's JSON parser accepts integers of any size and lone surrogates
    (``"\\ud800"``); orjson, which writes the body for the backend, does not. (Nesting
    deeper than orjson writes is refused before parsing: :mod:`gateway.request.raw_json`.)
    """
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
            found = _unforwardable(key, name) or _unforwardable(item, name)
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _unforwardable(item, f"{param}[{i}]")
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
