"""A stream's chunks folded into the non-streaming response OpenAI would have sent."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from gateway.context import Endpoint


def aggregate_chunks(endpoint: Endpoint, chunks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Fold a stream's chunks into the non-streaming response OpenAI would have sent."""
    first = chunks[0] if chunks else {}
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    for chunk in chunks:
        if chunk.get("usage"):
            usage = chunk["usage"]
        for ch in chunk.get("choices") or ():
            idx = int(ch.get("index", 0))
            if endpoint == "completions":
                acc = choices.setdefault(
                    idx, {"index": idx, "text": "", "logprobs": None, "finish_reason": None}
                )
                acc["text"] += ch.get("text") or ""
            else:
                acc = choices.setdefault(
                    idx,
                    {
                        "index": idx,
                        "message": {"role": "assistant", "content": None},
                        "logprobs": None,
                        "finish_reason": None,
                    },
                )
                _merge_delta(acc["message"], ch.get("delta") or {})
            if ch.get("finish_reason") is not None:
                acc["finish_reason"] = ch["finish_reason"]
    out = {
        "id": first.get("id", ""),
        "object": "text_completion" if endpoint == "completions" else "chat.completion",
        "created": first.get("created", int(time.time())),
        "model": first.get("model", ""),
        "choices": [choices[i] for i in sorted(choices)],
    }
    if usage is not None:
        out["usage"] = usage
    return out


def _merge_delta(message: dict[str, Any], delta: dict[str, Any]) -> None:
    for key, value in delta.items():
        if key == "role":
            message["role"] = value
        elif key == "tool_calls":
            calls = message.setdefault("tool_calls", [])
            for call in value or ():
                i = call.get("index", len(calls))
                while len(calls) <= i:
                    calls.append(
                        {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                    )
                target = calls[i]
                if call.get("id"):
                    target["id"] = call["id"]
                if call.get("type"):
                    target["type"] = call["type"]
                fn = call.get("function") or {}
                if fn.get("name"):
                    target["function"]["name"] += fn["name"]
                if fn.get("arguments"):
                    target["function"]["arguments"] += fn["arguments"]
        elif isinstance(value, str):
            message[key] = (message.get(key) or "") + value
        elif value is not None:
            message[key] = value
