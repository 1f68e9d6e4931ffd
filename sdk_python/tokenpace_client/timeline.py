"""What a paced stream records: when tokens arrived and when they were shown, and their QoE.

Times are seconds since the client sent the request, rounded UP to the microsecond (as
reported to the gateway: never earlier than measured), so the QoE computed here is the
one the gateway recomputes from the report.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from tokenpace_client.qoe import TimelineEntry, andes_of_times, monotone_of_times, token_times


def ceil_us(seconds: float) -> float:
    """``seconds`` rounded up to the microsecond (never earlier than measured)."""
    rounded = round(seconds, 6)
    return rounded if rounded >= seconds else round(rounded + 1e-6, 6)


@dataclass(frozen=True)
class Timeline:
    """``arrivals``: (time, tokens) per chunk read; ``displayed``: per piece released."""

    arrivals: tuple[TimelineEntry, ...]
    displayed: tuple[TimelineEntry, ...]


@dataclass(frozen=True)
class QoE:
    """Andes (Liu et al.) §3.1 Eq. 1 and the monotone QoE (docs/qoe.md) of both timelines.

    An empty timeline (nothing arrived, or nothing was shown) scores 0, as at the gateway.
    """

    andes: float
    monotone: float
    displayed_andes: float
    displayed_monotone: float

    @classmethod
    def of(cls, timeline: Timeline, ttft: float, tds: float) -> QoE:
        def score(entries: tuple[TimelineEntry, ...]) -> tuple[float, float]:
            if not entries:
                return 0.0, 0.0
            times = token_times(entries)
            return andes_of_times(times, ttft, tds), monotone_of_times(times, ttft, tds)

        arrived, shown = score(timeline.arrivals), score(timeline.displayed)
        return cls(arrived[0], arrived[1], shown[0], shown[1])


def gaps_over(entries: Sequence[TimelineEntry], limit: float) -> int:
    """How many times consecutive entries are more than ``limit`` seconds apart (rebuffering)."""
    times = [t for t, _ in entries]
    return sum(b - a > limit for a, b in itertools.pairwise(times)) if times else 0
