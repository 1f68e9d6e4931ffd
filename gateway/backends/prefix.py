"""A request's prompt as the router reads it: a chain of block names and its conversation.

The prompt's text (a chat's messages, each as its role and content; a completion's
prompt) is cut into blocks of ``block_chars`` characters, and block ``i`` named by
Python's ``hash`` of block ``i``'s text and the name of block ``i - 1``: a name stands
for the whole prefix to its end (:mod:`qos.prefix_cache`). A character block is not a
token block, so a name is a close estimate of what an engine holds, not its own block
hash (llm-d's approximate prefix scorer works the same way). A text's ``hash`` is
SipHash with a key drawn when the process starts: the names mean something only in the
process that made them, which is where its index lives, and a client cannot choose texts
whose names collide.

A conversation is named by BLAKE2b (8 bytes) of its text up to the end of its first user
message (``anchor``): every later turn resends that text unchanged, and the name is the
same in every gateway replica and every worker, since rendezvous routing
(:mod:`qos.routing`) is how they agree. Its history, what the earlier turns computed, is
its text up to the end of its last assistant message, counted in tokens by the same
chars/4 rule as the whole prompt (not in whole blocks: a block cut short at the history's
end was computed all the same). Its own text starts with that first user message
(``own_block``: the block where it starts); what comes before it (a system prompt) may be
shared by many conversations, so a backend whose estimated cache reaches past
``own_block`` is one an earlier turn of this conversation (or the same prompt) went to.
A completion's prompt has no turns: its first block names it, and it has no history and
no text of its own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import NamedTuple

from qos.prompt_tokens import CHARS_PER_TOKEN, estimate_chars_tokens, estimate_prompt_tokens

_SEPARATOR = "\x1e"  # between messages: no two message lists read as one text


class PromptChain(NamedTuple):
    """What the router reads of one prompt (the module docstring). A named tuple: one is
    built on every request's path (:class:`qos.routing.Candidate`'s note)."""

    blocks: tuple[int, ...]  # the names of its whole blocks, first first
    anchor: int  # its conversation's name
    history_tokens: int  # prompt tokens its conversation's earlier turns computed
    own_block: int  # the first block with its conversation's own text (len(blocks): none)
    tokens: int  # prompt tokens (estimated: :func:`qos.prompt_tokens.estimate_prompt_tokens`)
    block_tokens: float  # tokens a block stands for (block_chars / 4)

    def tokens_of(self, blocks: int) -> int:
        """Prompt tokens in the first ``blocks`` blocks (at most the whole prompt's)."""
        return min(round(blocks * self.block_tokens), self.tokens)


def _text(value: object) -> str:
    """A message content's text: a string, or the text of its parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_text(v) for v in value)
    if isinstance(value, dict):
        return _text(value.get("text"))
    return ""


def prompt_name(text: str) -> int:
    """A text's name, the same in every process: BLAKE2b, 8 bytes."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8)
    return int.from_bytes(digest.digest())


def prompt_chain(body: Mapping[str, object], block_chars: int) -> PromptChain:
    """The chain of ``body``, a chat or completions request (validated)."""
    parts: list[str] = []
    anchor_end = history_end = 0
    own_start: int | None = None
    size = 0
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if not isinstance(message, dict):
                continue
            role = message.get("role")
            content = message.get("content")
            text = content if isinstance(content, str) else _text(content)
            part = f"{role}:{text}{_SEPARATOR}"
            parts.append(part)
            start = size
            size += len(part)
            if role == "assistant":
                history_end = size
            elif role == "user" and not anchor_end:
                own_start, anchor_end = start, size
    else:
        prompt = body.get("prompt")
        parts.append(_text(prompt if not isinstance(prompt, list) else prompt[:1]))
    text = "".join(parts)
    tokens = estimate_prompt_tokens(body)
    blocks: list[int] = []
    name = 0
    for start in range(0, len(text) - block_chars + 1, block_chars):
        name = hash((name, text[start : start + block_chars]))
        blocks.append(name)
    return PromptChain(
        blocks=tuple(blocks),
        anchor=prompt_name(text[: anchor_end or block_chars]),
        history_tokens=min(estimate_chars_tokens(history_end), tokens) if history_end else 0,
        own_block=len(blocks) if own_start is None else own_start // block_chars,
        tokens=tokens,
        block_tokens=block_chars / CHARS_PER_TOKEN,
    )
