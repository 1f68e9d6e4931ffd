"""The display side of a paced stream, free of I/O: arrivals in, due pieces out.

The reader (a thread or a task) timestamps every chunk as it reads it; the stream hands
each one to :meth:`Pacer.arrive`, which counts its tokens, splits it into pieces
(:mod:`tokenpace_client.segment`) and gives each piece its release time
(:mod:`tokenpace_client.schedule`). :meth:`Pacer.pop` hands out the pieces that are
due; the stream sleeps until :meth:`Pacer.next_release` or the next arrival.

While the reader is away (:meth:`Pacer.away`, :meth:`Pacer.back`: the app backgrounded,
the speech paused) nothing is released and the reader's place is kept: release times run
on watched time (the time away taken out, as ``qos.metrics.watched_times``), so on their
return the next unread token goes out at once and the rest follow at the pace.
"""

from __future__ import annotations

import math
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
        # pieces with their release time on watched time (the time away taken out)
        self._due: deque[tuple[float, Piece]] = deque()
        self._held = 0  # tokens received, not yet released
        self._away_s = 0.0  # time away in closed spans
        self._away_since: float | None = None
        self._aways: list[tuple[float, float]] = []
        self._counted = 0
        self._arrivals: list[tuple[float, int]] = []
        self._displayed: list[tuple[float, int]] = []
        self.ended = False  # no more arrivals: the upstream finished, failed or was closed

    def _since(self, at: float) -> float:
        return ceil_us(max(at - self._sent_at, 0.0))

    def _watched(self, at: float) -> float:
        """``at`` on watched time: a moment away counts as the start of the away."""
        return (at if self._away_since is None else self._away_since) - self._away_s

    @property
    def buffered(self) -> int:
        """Tokens received and not yet released."""
        return self._held

    @property
    def is_away(self) -> bool:
        return self._away_since is not None

    def away(self, at: float) -> None:
        """The reader looked away at ``at``: releases stop, the place is kept."""
        if self._away_since is None:
            self._away_since = at

    def back(self, at: float) -> None:
        """The reader is back at ``at``: releases resume from the next unread token."""
        if self._away_since is None:
            return
        self._aways.append((self._since(self._away_since), self._since(at)))
        self._away_s += max(at - self._away_since, 0.0)
        self._away_since = None

    def read_by(self) -> float | None:
        """When the reader will have read every token released (clock time); ``None``
        before the first. Past it with nothing due and the upstream open, the reader waits."""
        free = self._schedule.free
        return None if free == -math.inf else free + self._away_s

    def _queue(self, at: float, piece: Piece) -> None:
        self._due.append((self._schedule.release_time(self._watched(at), piece.tokens), piece))
        self._held += piece.tokens

    def arrive(self, at: float, chunk: Any) -> None:
        """``chunk`` was read at ``at`` (clock time)."""
        tokens = chunk_tokens(chunk, self._counted)
        self._counted += tokens
        if tokens:
            self._arrivals.append((self._since(at), tokens))
        for piece in self._splitter.push(chunk, tokens):
            self._queue(at, piece)

    def end(self, at: float) -> None:
        """The upstream ended at ``at``: pending text goes out, paced, and all of it by
        ``at + max_drain_s`` of watched time; with ``end="flush"``, all now."""
        self.ended = True
        for piece in self._splitter.finish():
            self._queue(at, piece)
        if self._drain_s is not None:
            last = self._watched(at) + self._drain_s
            self._due = deque((min(r, last), p) for r, p in self._due)

    @property
    def drained(self) -> bool:
        return self.ended and not self._due

    def next_release(self) -> float | None:
        """When the next piece is due (clock time); ``None`` when none is or the reader is away."""
        if not self._due or self._away_since is not None:
            return None
        return self._due[0][0] + self._away_s

    def pop(self, now: float) -> Piece | None:
        """The next piece if it is due at ``now``, recorded as displayed at ``now``."""
        at = self.next_release()
        if at is None or at > now:
            return None
        _, piece = self._due.popleft()
        self._held -= piece.tokens
        if piece.tokens:
            self._displayed.append((self._since(now), piece.tokens))
        return piece

    def timeline(self, now: float) -> Timeline:
        """What arrived, what was shown, and when the reader was away (a span under way
        ends at ``now``)."""
        away = list(self._aways)
        if self._away_since is not None:
            away.append((self._since(self._away_since), self._since(now)))
        return Timeline(tuple(self._arrivals), tuple(self._displayed), tuple(away))
