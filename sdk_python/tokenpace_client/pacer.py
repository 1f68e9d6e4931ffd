"""The display side of a paced stream, free of I/O: arrivals in, due pieces out.

The reader (a thread or a task) timestamps every chunk as it reads it; the stream hands
each one to :meth:`Pacer.arrive`, which counts its tokens, splits it into pieces
(:mod:`tokenpace_client.segment`) and gives each piece its release time
(:mod:`tokenpace_client.schedule`). :meth:`Pacer.pop` hands out the pieces that are
due; the stream sleeps until :meth:`Pacer.next_release` or the next arrival.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Literal

from tokenpace_client.chunks import chunk_tokens
from tokenpace_client.schedule import ReleaseSchedule
from tokenpace_client.segment import Piece, Unit, make_splitter
from tokenpace_client.timeline import Timeline, ceil_us

End = Literal["drain", "flush"]
ENDS: tuple[End, ...] = ("drain", "flush")


class Pacer:
    """Pieces waiting for their release time, and the two timelines of one stream."""

    def __init__(
        self,
        *,
        tds: float,
        unit: Unit,
        end: End,
        sent_at: float,
        max_drain_s: float | None = None,
    ) -> None:
        self._schedule = ReleaseSchedule(tds)
        self._splitter = make_splitter(unit)
        # how long after the upstream's end pieces may still wait (None: no limit)
        self._drain_s = 0.0 if end == "flush" else max_drain_s
        self._sent_at = sent_at
        self._due: deque[tuple[float, Piece]] = deque()
        self._counted = 0
        self._arrivals: list[tuple[float, int]] = []
        self._displayed: list[tuple[float, int]] = []
        self.ended = False  # no more arrivals: the upstream finished, failed or was closed

    def _since(self, at: float) -> float:
        return ceil_us(max(at - self._sent_at, 0.0))

    def arrive(self, at: float, chunk: Any) -> None:
        """``chunk`` was read at ``at`` (clock time)."""
        tokens = chunk_tokens(chunk, self._counted)
        self._counted += tokens
        if tokens:
            self._arrivals.append((self._since(at), tokens))
        for piece in self._splitter.push(chunk, tokens):
            self._due.append((self._schedule.release_time(at, piece.tokens), piece))

    def end(self, at: float) -> None:
        """The upstream ended at ``at``: pending text goes out, paced, and all of it by
        ``at + max_drain_s``; with ``end="flush"``, all now."""
        self.ended = True
        for piece in self._splitter.finish():
            self._due.append((self._schedule.release_time(at, piece.tokens), piece))
        if self._drain_s is not None:
            last = at + self._drain_s
            self._due = deque((min(r, last), p) for r, p in self._due)

    @property
    def drained(self) -> bool:
        return self.ended and not self._due

    def next_release(self) -> float | None:
        return self._due[0][0] if self._due else None

    def pop(self, now: float) -> Piece | None:
        """The next piece if it is due at ``now``, recorded as displayed at ``now``."""
        if not self._due or self._due[0][0] > now:
            return None
        _, piece = self._due.popleft()
        if piece.tokens:
            self._displayed.append((self._since(now), piece.tokens))
        return piece

    def timeline(self) -> Timeline:
        return Timeline(tuple(self._arrivals), tuple(self._displayed))
