"""A chat body's shape, counted on its bytes before it is parsed (gateway/request/body.py)."""

from __future__ import annotations

import json
import time

import pytest

from gateway.errors import GatewayError
from gateway.request.body import STRICT_JSON_BYTES, check_shape


def body(messages: list, **extra: object) -> bytes:
    return json.dumps({"model": "m", "messages": messages, **extra}).encode()


def refusal(raw: bytes, max_messages: int = 2048, max_parts: int = 8192) -> GatewayError:
    with pytest.raises(GatewayError) as exc:
        check_shape(raw, max_messages, max_parts)
    return exc.value


HI = {"role": "user", "content": "hi"}


def test_messages_are_counted_before_the_body_is_parsed() -> None:
    check_shape(body([HI] * 2048), 2048, 8192)
    e = refusal(body([HI] * 2049))
    assert (e.status, e.param, e.code) == (400, "messages", "too_many_messages")
    assert "2049 messages" in e.message and "2048" in e.message
    assert refusal(body([HI] * 17), max_messages=16).code == "too_many_messages"


def test_parts_tool_calls_and_tools_count_together() -> None:
    parts = {"role": "user", "content": [{"type": "text", "text": "x"}] * 5}
    calls = {"role": "assistant", "tool_calls": [{"id": "c"}] * 3}
    tools = [{"type": "function"}] * 2
    check_shape(body([parts, calls], tools=tools), 2048, 10)
    e = refusal(body([parts, calls], tools=tools), max_parts=9)
    assert (e.status, e.code) == (400, "too_many_parts") and "10 content parts" in e.message
    # other shapes are the validation's to refuse, not the count's
    check_shape(body(["not a message", {"role": "user", "content": {"a": 1}}]), 2048, 10)
    check_shape(json.dumps({"model": "m", "prompt": [1] * 20000}).encode(), 2048, 10)


def test_a_large_body_must_be_strict_json_a_small_one_is_left_to_the_parser() -> None:
    small = b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}'
    check_shape(small, 2048, 8192)  # the validation names the field
    large = body([{"role": "user", "content": "x" * STRICT_JSON_BYTES}]).replace(b'"x', b'"\\ud800')
    assert refusal(large).code == "invalid_json"
    assert refusal(b"[" + b"[]," * 30000 + b"[]]").code == "invalid_type"


def test_the_count_costs_a_fraction_of_the_validation() -> None:
    """120,000 messages (4 MB, the body that held the event loop for 0.4 s): refused in
    a few milliseconds; the bound is loose, for a loaded machine."""
    raw = body([HI] * 120_000)
    started = time.perf_counter()
    assert refusal(raw).code == "too_many_messages"
    assert time.perf_counter() - started < 0.25
