"""Write the token-count test vectors every reader of OpenAI stream chunks is checked against.

The gateway's :meth:`gateway.backends.chunk.ChunkView.tokens` is the reference
(docs/protocol.md, "Gateway-side measurements"). The client SDKs (``sdk_python``,
``sdk_web``) count the tokens of the chunks they pace with their own dependency-free
copies; each test suite checks its copy against ``tests/vectors/chunk_tokens.json``, and
``tests/gateway/backends/test_chunk.py`` checks that every count in the committed file is
what the gateway counts today. Rewrite the file after changing the rule:

    .venv/bin/python scripts/make_chunk_vectors.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson

from gateway.backends.chunk import read_chunk

OUT = Path(__file__).resolve().parent.parent / "tests" / "vectors" / "chunk_tokens.json"


def _chat(*deltas: dict[str, Any], **extra: Any) -> dict[str, Any]:
    choices = [{"index": i, "delta": d, "finish_reason": None} for i, d in enumerate(deltas)]
    return {"id": "c", "object": "chat.completion.chunk", "choices": choices, **extra}


def _text(*texts: str, **extra: Any) -> dict[str, Any]:
    choices = [{"index": i, "text": t, "finish_reason": None} for i, t in enumerate(texts)]
    return {"id": "c", "object": "text_completion", "choices": choices, **extra}


def _usage(completion_tokens: int) -> dict[str, int]:
    prompt = 5
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
    }


CALL = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}

CASES: list[tuple[str, dict[str, Any], int]] = [
    ("content", _chat({"content": "Hi"}), 0),
    ("reasoning-content", _chat({"reasoning_content": "hmm"}), 0),
    ("reasoning", _chat({"reasoning": "hmm"}), 0),
    ("refusal", _chat({"refusal": "I can't"}), 0),
    ("tool-call", _chat({"tool_calls": [CALL]}), 0),
    ("role-only", _chat({"role": "assistant"}), 0),
    ("role-and-empty-content", _chat({"role": "assistant", "content": ""}), 0),
    ("null-content", _chat({"content": None}), 0),
    ("empty-tool-calls", _chat({"content": None, "tool_calls": []}), 0),
    ("empty-delta", _chat({}), 0),
    ("finish", {**_chat({}), "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, 0),
    ("usage-only", _chat(usage=_usage(9)), 5),
    ("two-choices", _chat({"content": "a"}, {"content": "b"}), 0),
    ("two-choices-one-new", _chat({"content": "a"}, {"role": "assistant"}), 0),
    ("running-usage-ahead", _chat({"content": "abcd"}, usage=_usage(7)), 3),
    ("running-usage-level", _chat({"content": "a"}, usage=_usage(4)), 3),
    ("running-usage-behind", _chat({"content": "a"}, usage=_usage(2)), 3),
    ("running-usage-null", _chat({"content": "a"}, usage=None), 3),
    ("running-usage-no-new-text", _chat({}, usage=_usage(12)), 3),
    ("completion-text", _text(" hi"), 0),
    ("completion-empty-text", _text(""), 0),
    ("completion-two-choices", _text("a", "b"), 0),
    ("completion-running-usage", _text("abc", usage=_usage(10)), 7),
]


def vectors() -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "chunk": chunk,
            "counted": counted,
            "tokens": read_chunk(orjson.dumps(chunk)).tokens(counted),
        }
        for name, chunk, counted in CASES
    ]


def main() -> None:
    about = (
        "Token counts of OpenAI stream chunks, generated from gateway.backends.chunk by "
        "scripts/make_chunk_vectors.py; do not edit. tokens: what the chunk delivers, "
        "counted tokens of its stream having come before it."
    )
    doc = {"about": about, "vectors": vectors()}
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
