"""A JSON body's depth counted on its bytes equals the parsed value's, whatever its strings
hold (brackets, quotes and backslashes escaped)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import GatewayError
from gateway.request.raw_json import MAX_JSON_DEPTH, check_raw_json, json_depth

TEXT = st.text(alphabet=st.sampled_from('[]{}"\\ab\n\u00e9\u2028'), max_size=8)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=30,
)


def depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    return 0


@settings(max_examples=300, derandomize=True)
@given(value=VALUES, ascii_only=st.booleans())
def test_the_depth_on_the_bytes_is_the_parsed_depth(value: Any, ascii_only: bool) -> None:
    body = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert json_depth(body) == depth(value)


def nested(levels: int) -> bytes:
    return b'{"a": ' * levels + b"1" + b"}" * levels


def test_the_limit_is_the_deepest_body_orjson_writes() -> None:
    import orjson

    check_raw_json(nested(MAX_JSON_DEPTH))
    orjson.dumps(orjson.loads(nested(MAX_JSON_DEPTH)))
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(orjson.loads(nested(MAX_JSON_DEPTH + 1)))
    with pytest.raises(GatewayError) as refused:
        check_raw_json(nested(MAX_JSON_DEPTH + 1))
    assert refused.value.status == 400 and refused.value.code == "invalid_json"


def test_a_body_that_is_not_utf8_is_invalid_json() -> None:
    check_raw_json('{"a": "\u00e9"}'.encode())
    with pytest.raises(GatewayError) as refused:
        check_raw_json(b'{"a": "\xff"}')
    assert refused.value.code == "invalid_json" and "byte 7" in refused.value.message
