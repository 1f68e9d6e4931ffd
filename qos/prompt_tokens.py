"""Prompt tokens estimated from text, where no tokenizer is at hand: chars / 4.

About four characters per token for English text (OpenAI's rule of thumb), rounded to
the nearest token, at least one. One rule for the gateway (what admission charges and
the per-minute token limits count, before any engine has tokenized the prompt), the
embedded simulated engine (the usage it reports) and the simulator's workloads (the
Andes trace stores prompt texts, not token ids; its shipped numbers were counted so).
"""

from __future__ import annotations

from collections.abc import Mapping

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4  # a chat message's role and framing around its content


def estimate_text_tokens(text: str) -> int:
    """Tokens of a prompt text: ``max(1, round(len(text) / 4))``."""
    return estimate_chars_tokens(len(text))


def estimate_chars_tokens(chars: int) -> int:
    """Tokens of ``chars`` characters of prompt text: ``max(1, round(chars / 4))``."""
    return max(1, round(chars / CHARS_PER_TOKEN))


def estimate_prompt_tokens(body: Mapping[str, object]) -> int:
    """Prompt tokens of a completions or chat completions request body.

    The text of ``prompt`` (a string or a list of them) and of every message's content
    (a string, or parts whose ``text`` counts), plus :data:`MESSAGE_OVERHEAD_TOKENS`
    per message; the same chars/4 rule as :func:`estimate_text_tokens` on the total.
    """
    chars = _chars(body.get("prompt"))
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict):
                chars += _chars(message.get("content"))
                chars += MESSAGE_OVERHEAD_TOKENS * CHARS_PER_TOKEN
    return estimate_chars_tokens(chars)


def _chars(value: object) -> int:
    """Characters of text in a prompt or a message content (nested lists and parts)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    if isinstance(value, dict):
        return _chars(value.get("text")) + _chars(value.get("content"))
    return 0
