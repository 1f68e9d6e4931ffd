"""Fitting a timeline into a telemetry report's point limit (docs/protocol.md, telemetry).

The rule both SDKs share: a timeline of n entries longer than the limit L keeps its
first entry (the first token's arrival) alone and cuts the other n - 1 into L - 1 runs
of consecutive entries, run j holding entries floor(j·m/(L-1)) … floor((j+1)·m/(L-1)) - 1
of them (m = n - 1); each run becomes one entry at the time of its LAST entry with the
sum of its tokens. Coalescing only moves tokens later, so the QoE the gateway recomputes
(Andes (Liu et al.) §3.1 Eq. 1, the monotone QoE of docs/qoe.md) can only be lower than
the true one, never flattered.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenpace_client.qoe import TimelineEntry


def coalesce(timeline: Sequence[TimelineEntry], limit: int) -> list[TimelineEntry]:
    """``timeline`` in at most ``limit`` entries (``limit`` >= 2), by the shared rule above."""
    if limit < 2:
        raise ValueError(f"limit: must be at least 2, got {limit}")
    n = len(timeline)
    if n <= limit:
        return list(timeline)
    rest, m, runs = timeline[1:], n - 1, limit - 1
    out = [timeline[0]]
    for j in range(runs):
        run = rest[j * m // runs : (j + 1) * m // runs]
        out.append((run[-1][0], sum(tokens for _, tokens in run)))
    return out
