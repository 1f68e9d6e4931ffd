"""What the gateway reads of a streamed OpenAI chunk, decoded without the rest of it.

The relay counts every chunk's tokens, keeps the last ``usage`` and stops at an error
event; everything else in a chunk (ids, model, logprobs, finish reasons) is relayed as
it came and never becomes a Python object. :func:`read_chunk` decodes a chunk's JSON
straight into the slotted :class:`ChunkView` with msgspec, which skips the fields it is
not asked for: under load the relay's full parse of every chunk into dicts, and their
freeing, was the largest part of what the gateway's CPU per token added to the stack
floor's (docs/benchmarks.md, "Gateway cost").
"""

from __future__ import annotations

from typing import Any

import msgspec


class DeltaView(msgspec.Struct, gc=False):
    """A chat choice's ``delta``: the fields that deliver output (any truthy value does)."""

    content: Any = None
    reasoning_content: Any = None
    reasoning: Any = None
    tool_calls: Any = None
    refusal: Any = None

    def delivers(self) -> bool:
        return bool(
            self.content
            or self.reasoning_content
            or self.reasoning
            or self.tool_calls
            or self.refusal
        )


class ChoiceView(msgspec.Struct, gc=False):
    """A choice: a chat ``delta``, or a text completion's ``text``."""

    delta: DeltaView | None = None
    text: Any = None


class ChunkView(msgspec.Struct, gc=False):
    """A chunk's choices, its ``usage`` and an OpenAI error event's ``error``."""

    choices: list[ChoiceView] | None = None
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None

    def tokens(self, counted: int) -> int:
        """Tokens this chunk delivers, ``counted`` tokens of its stream having come before
        it (docs/protocol.md, "Gateway-side measurements").

        One per choice with new text, reasoning, refusal or tool call (vLLM and OpenAI
        send one token per choice per chunk when streaming); a chunk with only a role, a
        finish reason or usage delivers none. When it also carries a running
        ``usage.completion_tokens`` that says more (vLLM's ``--stream-interval`` > 1
        with continuous usage stats), that many. The client SDKs' counts are checked
        against this one on ``tests/vectors/chunk_tokens.json``
        (scripts/make_chunk_vectors.py).
        """
        n = 0
        for choice in self.choices or ():
            delta = choice.delta
            if delta is not None:
                n += delta.delivers()
            elif choice.text:
                n += 1
        if n and self.usage is not None:
            total = self.usage.get("completion_tokens")
            if isinstance(total, int) and total > counted + n:
                n = total - counted
        return n


_DECODER = msgspec.json.Decoder(ChunkView)


def read_chunk(payload: bytes) -> ChunkView:
    """The view of one chunk's JSON. Raises ``msgspec.ValidationError`` (a ``ValueError``)
    when it is JSON but not a chunk (not an object, or ``choices``, ``delta``, ``usage``
    or ``error`` of the wrong type), ``msgspec.DecodeError`` (also one) when it is not
    JSON."""
    return _DECODER.decode(payload)
