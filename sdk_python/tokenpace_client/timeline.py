"""What a paced stream records: when tokens arrived and when they were shown, and their QoE.

Times are seconds since the client sent the request, rounded UP to the microsecond (as
reported to the gateway: never earlier than measured), so the QoE computed here is the
one the gateway recomputes from the report.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from tokenpace_client.qoe import (
    Freezes,
    Spans,
    TimelineEntry,
    andes_of_times,
    freezes_of_times,
    idle_of_times,
    monotone_of_times,
    token_times,
    watched_times,
)


def ceil_us(seconds: float) -> float:
    """``seconds`` rounded up to the microsecond (never earlier than measured)."""
    rounded = round(seconds, 6)
    return rounded if rounded >= seconds else round(rounded + 1e-6, 6)


@dataclass(frozen=True)
class Timeline:
    """``arrivals``: (time, tokens) per chunk read; ``displayed``: per piece released;
    ``away``: (start, end) spans the reader was away, in time order."""

    arrivals: tuple[TimelineEntry, ...]
    displayed: tuple[TimelineEntry, ...]
    away: tuple[tuple[float, float], ...] = ()


_Scores = tuple[float, float, Freezes | None, float | None]


@dataclass(frozen=True)
class QoE:
    """What the user got, scored on both timelines (docs/qoe.md).

    ``andes``/``monotone``: Andes (Liu et al.) §3.1 Eq. 1 and the monotone QoE; an empty
    timeline (nothing arrived, or nothing was shown) scores 0, as at the gateway.
    ``freezes``: the display gaps beyond the reader's pace seen while the reader watched
    (``Timeline.away``); ``idle_s``: the user idle
    latency (Wang et al. Eq. 9); both None for an empty timeline. Of the arrivals, they
    are what the release rule shows (what ``qos.metrics`` gives for the reported
    arrivals); of the
    displayed timeline, what was shown as measured, with the unit's grouping, ``flush``,
    and the lateness of the timer that released each piece.
    """

    andes: float
    monotone: float
    displayed_andes: float
    displayed_monotone: float
    freezes: Freezes | None = None
    idle_s: float | None = None
    displayed_freezes: Freezes | None = None
    displayed_idle_s: float | None = None

    @classmethod
    def of(cls, timeline: Timeline, ttft: float, tds: float) -> QoE:
        away: Spans = timeline.away

        def score(entries: tuple[TimelineEntry, ...]) -> _Scores:
            if not entries:
                return 0.0, 0.0, None, None
            times = token_times(entries)
            return (
                andes_of_times(times, ttft, tds),
                monotone_of_times(times, ttft, tds),
                freezes_of_times(watched_times(times, away), tds),
                idle_of_times(times, ttft, tds),
            )

        andes, monotone, frozen, idle = score(timeline.arrivals)
        shown_andes, shown_monotone, shown_frozen, shown_idle = score(timeline.displayed)
        return cls(
            andes, monotone, shown_andes, shown_monotone, frozen, idle, shown_frozen, shown_idle
        )


def gaps_over(entries: Sequence[TimelineEntry], limit: float) -> int:
    """How many times consecutive entries are more than ``limit`` seconds apart (rebuffering)."""
    times = [t for t, _ in entries]
    return sum(b - a > limit for a, b in itertools.pairwise(times)) if times else 0
