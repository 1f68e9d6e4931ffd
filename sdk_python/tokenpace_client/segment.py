"""Turning the chunks that arrive into the pieces the pacer releases (``unit``).

- ``token``: a piece per token. A chunk that carries several tokens (its running
  ``usage.completion_tokens`` says so) is split into that many copies, each with a part
  of its text, cut between words where it can.
- ``word``: whole words. A word is complete once the whitespace that follows it has
  arrived; a word of n tokens is a piece of n tokens (it takes n/TDS to read).
- ``sentence``: whole sentences (text-to-speech): complete at terminal punctuation
  followed by whitespace, or at a newline.

A chunk's tokens are placed on its characters (evenly), so the tokens of a word or a
sentence are the tokens whose characters it holds; a unit that holds none is joined to
the next one. Every piece is a copy of a chunk whose delta carries the piece's text;
chunks that are not plain one-choice text (roles, finish reasons, tool calls, usage,
several choices) go out whole, after whatever text is pending.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from tokenpace_client.chunks import chunk_text, with_text

Unit = Literal["token", "word", "sentence"]
UNITS: tuple[Unit, ...] = ("token", "word", "sentence")

_WORD = re.compile(r"\s*\S+(?=\s)")
_SENTENCE = re.compile(r"\s*[^\n]*?(?:[.!?…]+[\"'”’)\]]*(?=\s)|\n)")
_WORDS = re.compile(r"\s*\S+\s*$|\s*\S+")


@dataclass(frozen=True, slots=True)
class Piece:
    """What the pacer releases: a chunk (or a copy with part of its text) and its tokens."""

    chunk: Any
    tokens: int


class Splitter(Protocol):
    def push(self, chunk: Any, tokens: int) -> list[Piece]:
        """The pieces complete once ``chunk`` (carrying ``tokens``) has arrived."""
        ...

    def finish(self) -> list[Piece]:
        """What is still pending at the end of the stream."""
        ...


def split_text(text: str, n: int) -> list[str]:
    """``text`` cut into at most ``n`` consecutive parts, between words where possible."""
    parts = _WORDS.findall(text) or [text]
    while len(parts) < n:
        longest = max(range(len(parts)), key=lambda i: len(parts[i]))
        part = parts[longest]
        if len(part) < 2:
            break
        half = len(part) // 2
        parts[longest : longest + 1] = [part[:half], part[half:]]
    if len(parts) > n:
        k = len(parts)
        parts = ["".join(parts[j * k // n : (j + 1) * k // n]) for j in range(n)]
    return parts


class TokenSplitter:
    """``unit="token"``: a piece per token."""

    def push(self, chunk: Any, tokens: int) -> list[Piece]:
        text = chunk_text(chunk) if tokens > 1 else None
        if text is None:
            return [Piece(chunk, tokens)]
        parts = split_text(text, tokens)
        counts = [1] * len(parts)
        counts[-1] += tokens - len(parts)  # text too short for its tokens: the rest go last
        return [Piece(with_text(chunk, p), c) for p, c in zip(parts, counts, strict=True)]

    def finish(self) -> list[Piece]:
        return []


class UnitSplitter:
    """``unit="word"`` or ``"sentence"``: text is held until a unit is complete."""

    def __init__(self, boundary: re.Pattern[str]) -> None:
        self._boundary = boundary
        self._text = ""
        self._marks: list[int] = []  # the character each pending token sits on
        self._template: Any = None  # the last text chunk: the pieces are copies of it

    def push(self, chunk: Any, tokens: int) -> list[Piece]:
        text = chunk_text(chunk)
        if text is None:
            return [*self.finish(), Piece(chunk, tokens)]
        offset, size = len(self._text), len(text)
        self._text += text
        self._marks.extend(
            offset + min(size - 1, (2 * i + 1) * size // (2 * tokens)) for i in range(tokens)
        )
        self._template = chunk
        return self._complete()

    def _complete(self) -> list[Piece]:
        out: list[Piece] = []
        cut = pos = 0
        while (match := self._boundary.match(self._text, pos)) is not None and match.end() > pos:
            pos = match.end()
            tokens = bisect_left(self._marks, pos) - bisect_left(self._marks, cut)
            if tokens:  # a unit without tokens joins the next one
                out.append(Piece(with_text(self._template, self._text[cut:pos]), tokens))
                cut = pos
        if cut:
            first = bisect_left(self._marks, cut)
            self._marks = [m - cut for m in self._marks[first:]]
            self._text = self._text[cut:]
        return out

    def finish(self) -> list[Piece]:
        if not self._text:
            return []
        piece = Piece(with_text(self._template, self._text), len(self._marks))
        self._text, self._marks = "", []
        return [piece]


def make_splitter(unit: Unit) -> Splitter:
    if unit == "token":
        return TokenSplitter()
    return UnitSplitter(_WORD if unit == "word" else _SENTENCE)
