"""read_chunk and ChunkView.tokens: what the relay reads of each streamed chunk."""

from __future__ import annotations

import json

import msgspec
import orjson
import pytest

from gateway.backends.chunk import read_chunk
from tests.support.paths import VECTORS


def _tokens(chunk: object, counted: int = 0) -> int:
    return read_chunk(orjson.dumps(chunk)).tokens(counted)


@pytest.mark.parametrize(
    ("delta", "tokens"),
    [
        ({"content": "a"}, 1),
        ({"reasoning_content": "hm"}, 1),
        ({"reasoning": "hm"}, 1),
        ({"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}, 1),
        ({"refusal": "no"}, 1),
        ({"role": "assistant"}, 0),
        ({"role": "assistant", "content": ""}, 0),
        ({"content": None, "tool_calls": []}, 0),
        ({}, 0),
    ],
)
def test_a_chat_choice_delivers_a_token_when_its_delta_brings_output(
    delta: dict[str, object], tokens: int
) -> None:
    assert _tokens({"choices": [{"index": 0, "delta": delta}]}) == tokens


def test_text_completions_finish_and_usage_chunks() -> None:
    assert _tokens({"choices": [{"index": 0, "text": " hi"}]}) == 1
    assert _tokens({"choices": [{"index": 0, "text": ""}]}) == 0
    assert _tokens({"choices": [{"index": 0, "delta": None, "text": "x"}]}) == 1
    assert _tokens({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}) == 0
    assert _tokens({"choices": [], "usage": {"completion_tokens": 9}}, counted=5) == 0
    assert _tokens({"choices": None}) == 0 and _tokens({}) == 0


def test_one_token_per_choice_unless_a_running_usage_says_more() -> None:
    two = [{"index": i, "delta": {"content": "a"}} for i in range(2)]
    assert _tokens({"choices": two}) == 2
    ahead = {"choices": two[:1], "usage": {"completion_tokens": 7}}
    assert _tokens(ahead, counted=3) == 4  # 7 generated, 3 counted before
    assert _tokens(ahead, counted=7) == 1  # a running count that says less: one per choice
    assert _tokens({"choices": two[:1], "usage": {"completion_tokens": "7"}}, counted=3) == 1


def test_the_rest_of_a_chunk_is_never_decoded() -> None:
    """Fields the relay does not read may hold anything JSON allows."""
    payload = (
        b'{"id": "x", "created": 123456789012345678901234567890, "model": 1e999,'
        b' "logprobs": {"content": [[[[{"deep": null}]]]]}, "object": ["not", "a", "string"],'
        b' "choices": [{"index": "zero", "finish_reason": 7, "delta": {"content": "a",'
        b' "role": 0}}], "system_fingerprint": {}}'
    )
    view = read_chunk(payload)
    assert view.tokens(0) == 1 and view.usage is None and view.error is None


@pytest.mark.parametrize(
    ("payload", "where"),
    [
        (b"[1, 2]", "got `array`"),
        (b'"text"', "got `str`"),
        (b'{"choices": "abc"}', "$.choices"),
        (b'{"choices": [1]}', "$.choices[0]"),
        (b'{"choices": [{"delta": "a"}]}', "$.choices[0].delta"),
        (b'{"usage": 3}', "$.usage"),
        (b'{"error": "boom"}', "$.error"),
    ],
)
def test_json_that_is_not_a_chunk_says_where(payload: bytes, where: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=r"Expected .*") as err:
        read_chunk(payload)
    assert where in str(err.value)
    assert isinstance(err.value, ValueError)


def test_what_is_not_json_is_a_decode_error() -> None:
    for payload in (b"{oops", b"", b'{"choices": [}', b"\xff"):
        with pytest.raises(msgspec.DecodeError):
            read_chunk(payload)


VECTORS = json.loads((VECTORS / "chunk_tokens.json").read_text())["vectors"]


def test_the_shared_vectors_are_what_the_gateway_counts() -> None:
    """The SDKs check their counts against tests/vectors/chunk_tokens.json; it must be
    the gateway's (scripts/make_chunk_vectors.py rewrites it)."""
    assert len(VECTORS) >= 20 and {v["tokens"] for v in VECTORS} >= {0, 1, 2, 3, 4}
    for vec in VECTORS:
        assert _tokens(vec["chunk"], vec["counted"]) == vec["tokens"], vec["name"]
