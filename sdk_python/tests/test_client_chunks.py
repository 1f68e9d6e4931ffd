"""The client counts a chunk's tokens as the gateway does, on every shared test vector.

``tests/vectors/chunk_tokens.json`` is generated from the gateway's count
(scripts/make_chunk_vectors.py) and tied to it by the server's tests; this suite checks
``tokenpace_client.chunks.chunk_tokens`` against the same file, on plain dicts and on the
``openai`` package's chat chunk objects.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai.types.chat import ChatCompletionChunk
from tokenpace_client.chunks import chunk_tokens

VECTORS = json.loads(
    (Path(__file__).resolve().parents[2] / "tests" / "vectors" / "chunk_tokens.json").read_text()
)["vectors"]


def test_there_are_vectors() -> None:
    assert len(VECTORS) >= 20


@pytest.mark.parametrize("vec", VECTORS, ids=lambda v: v["name"])
def test_chunk_tokens_match_the_vectors(vec: dict) -> None:
    chunk = vec["chunk"]
    assert chunk_tokens(chunk, vec["counted"]) == vec["tokens"]
    if chunk["object"] == "chat.completion.chunk":
        typed = ChatCompletionChunk.model_validate({"created": 0, "model": "m", **chunk})
        assert chunk_tokens(typed, vec["counted"]) == vec["tokens"]
