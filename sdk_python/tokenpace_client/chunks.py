"""Reading and copying OpenAI stream chunks, as openai objects or as plain dicts.

Tokens are counted as the gateway counts them (docs/protocol.md, "Gateway-side
measurements"): one per choice with new content, reasoning, refusal, tool call or
completion text; a role-only, finish or usage chunk carries none; when the chunk also
carries a running ``usage.completion_tokens`` that says more (vLLM's
``--stream-interval``), that many. The count is checked against the gateway's on the
shared vectors ``tests/vectors/chunk_tokens.json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_PAYLOAD = ("content", "reasoning_content", "reasoning", "tool_calls", "refusal")


def get_field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def _choice_has_token(choice: Any) -> bool:
    delta = get_field(choice, "delta")
    if delta is not None:
        return any(get_field(delta, key) for key in _PAYLOAD)
    return bool(get_field(choice, "text"))


def chunk_tokens(chunk: Any, counted: int) -> int:
    """Tokens ``chunk`` delivers, ``counted`` tokens having come before it."""
    n = sum(_choice_has_token(c) for c in get_field(chunk, "choices") or ())
    usage = get_field(chunk, "usage")
    total = get_field(usage, "completion_tokens") if usage is not None else None
    if n and isinstance(total, int) and total > counted + n:
        n = total - counted
    return n


def chunk_text(chunk: Any) -> str | None:
    """The text of a one-choice chunk that carries nothing but text, else ``None``.

    Only such chunks are split into pieces or joined into words and sentences; any
    other chunk (roles, finish reasons, tool calls, several choices) goes out whole.
    """
    choices: Sequence[Any] = get_field(chunk, "choices") or ()
    if len(choices) != 1 or get_field(choices[0], "finish_reason"):
        return None
    choice = choices[0]
    delta = get_field(choice, "delta")
    if delta is None:
        text = get_field(choice, "text")
        return text if isinstance(text, str) and text else None
    content = get_field(delta, "content")
    if not isinstance(content, str) or not content:
        return None
    if any(get_field(delta, key) for key in _PAYLOAD if key != "content"):
        return None
    return content


def with_text(chunk: Any, text: str) -> Any:
    """A copy of a :func:`chunk_text` chunk whose text is ``text`` (the original is untouched)."""
    choices: Sequence[Any] = get_field(chunk, "choices") or ()
    choice = choices[0]
    delta = get_field(choice, "delta")
    if isinstance(chunk, dict):
        new_choice = (
            {**choice, "text": text}
            if delta is None
            else {
                **choice,
                "delta": {**delta, "content": text},
            }
        )
        return {**chunk, "choices": [new_choice]}
    if delta is None:
        new_choice = choice.model_copy(update={"text": text})
    else:
        new_choice = choice.model_copy(update={"delta": delta.model_copy(update={"content": text})})
    return chunk.model_copy(update={"choices": [new_choice]})
