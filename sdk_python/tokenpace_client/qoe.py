"""QoE of a streamed reply, in pure Python: the client's copy of ``qos.timeline``/``qos.metrics``.

The same formulas as the gateway's (docs/qoe.md), checked against the shared test
vectors ``tests/vectors/qoe.json`` that are generated from ``qos.metrics``:

- the digestion schedule (Andes (Liu et al.) §3.1: the reader takes 1/TDS per token,
  never before it arrives): d_k = max(t_k, d_(k-1) + 1/TDS), in the closed form
  d_k = (k-1)/TDS + max_(j<=k) (t_j - (j-1)/TDS);
- Andes QoE, Andes (Liu et al.) §3.1 Eq. 1, in closed form;
- the monotone QoE of docs/qoe.md, which delaying a token can never raise;
- the freezes of docs/qoe.md: display gaps beyond the reader's pace,
  (d_k - d_(k-1)) - 1/TDS > 1e-6 s, the wait for the first token not counted; only those
  seen while the reader watches count (:func:`watched_times`, checked against
  ``tests/vectors/signals.json``);
- user idle latency, Wang et al., "Revisiting SLOs and System Level Metrics in LLM
  Serving", Eq. 9: l = max_i (t_i - (TTFT + (i-1)/TDS))⁺.

The entries of a timeline are ``[(seconds since the request, tokens), ...]`` per chunk,
or per-token times.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

TimelineEntry = tuple[float, int]
"""(seconds since the request was sent, tokens): one chunk read, or one piece shown."""

Entries = Sequence[TimelineEntry] | Sequence[float]
"""One timeline's entries, per chunk or as per-token times."""


def token_times(timeline: Entries) -> list[float]:
    """Per-token arrival times of ``timeline``, validated as ``qos.timeline.token_times`` does.

    Raises ``ValueError`` when it is empty, has negative or non-finite times, is not
    non-decreasing, or a chunk has a non-positive token count.
    """
    times: list[float] = []
    for entry in timeline:
        if isinstance(entry, tuple | list):
            t, n = entry
            if int(n) != n or n <= 0:
                raise ValueError("timeline: chunk token counts must be positive integers")
            times.extend([float(t)] * int(n))
        else:
            times.append(float(entry))
    if not times:
        raise ValueError("timeline: empty timeline; a reply needs at least one token")
    for i, t in enumerate(times):
        if not math.isfinite(t) or t < 0:
            raise ValueError(f"timeline: times must be finite and >= 0, got {t}")
        if i and t < times[i - 1]:
            raise ValueError(f"timeline: not non-decreasing (token {i} at {t})")
    return times


def check_expectation(ttft: float, tds: float) -> None:
    """Raise ``ValueError`` unless TTFT >= 0 and TDS > 0 (both finite)."""
    if not math.isfinite(ttft) or ttft < 0:
        raise ValueError(f"ttft: must be a finite number >= 0, got {ttft}")
    if not math.isfinite(tds) or tds <= 0:
        raise ValueError(f"tds: must be a finite number > 0, got {tds}")


def digestion_starts(times: Sequence[float], tds: float, hold_until: float = 0.0) -> list[float]:
    """When the reader starts each token: d_k = max(t_k, d_(k-1) + 1/TDS).

    Andes (Liu et al.) §3.1, docs/qoe.md recursion (D); this is the pacing schedule.
    ``hold_until`` holds earlier tokens until then (the monotone QoE holds them until TTFT).
    """
    starts: list[float] = []
    run = -math.inf
    for k, t in enumerate(times):
        offset = k / tds
        run = max(run, max(t, hold_until) - offset)
        starts.append(offset + run)
    return starts


def _digested_area(start: float, until: float, tds: float) -> float:
    """∫_0^until of one token's digestion ramp (0 at its start, 1 a 1/TDS later)."""
    u = max(until - start, 0.0)
    step = 1.0 / tds
    return 0.5 * tds * u * u if u <= step else u - 0.5 * step


def _expected_area(until: float, ttft: float, tds: float, length: float) -> float:
    """∫_0^until min(T(t), l) dt, T(t) = TDS·(t - TTFT)⁺: the denominator of Andes Eq. 1."""
    u = max(until - ttft, 0.0)
    ramp = length / tds
    return 0.5 * tds * u * u if u <= ramp else 0.5 * length * ramp + length * (u - ramp)


def andes_qoe(timeline: Entries, ttft: float, tds: float) -> float:
    """Andes QoE, Andes (Liu et al.) §3.1 Eq. 1: S_actual / S_expected up to the last token.

    A is the reader's digestion curve, T the expected curve; clamped to [0, 1]; a reply
    fully delivered before the expected TTFT scores 1 (docs/qoe.md).
    """
    times = token_times(timeline)
    check_expectation(ttft, tds)
    return andes_of_times(times, ttft, tds)


def andes_of_times(times: Sequence[float], ttft: float, tds: float) -> float:
    """:func:`andes_qoe` of validated per-token ``times``."""
    ttlt = times[-1]
    s_expected = _expected_area(ttlt, ttft, tds, float(len(times)))
    if s_expected <= 0.0:
        return 1.0
    starts = digestion_starts(times, tds)
    s_actual = math.fsum(_digested_area(d, ttlt, tds) for d in starts)
    return min(max(s_actual / s_expected, 0.0), 1.0)


def monotone_qoe(timeline: Entries, ttft: float, tds: float) -> float:
    """Monotone QoE (docs/qoe.md): E / (E + deficit), E = l²/(2·TDS).

    deficit = Σ_k (d'_k - e_k): d'_k the digestion start with tokens held until the
    expected TTFT, e_k = TTFT + (k-1)/TDS (the expected curve of Andes Eq. 1).
    """
    times = token_times(timeline)
    check_expectation(ttft, tds)
    return monotone_of_times(times, ttft, tds)


def monotone_of_times(times: Sequence[float], ttft: float, tds: float) -> float:
    """:func:`monotone_qoe` of validated per-token ``times``."""
    starts = digestion_starts(times, tds, hold_until=ttft)
    deficit = math.fsum(d - (ttft + k / tds) for k, d in enumerate(starts))
    n = len(times)
    area = n * n / (2.0 * tds)
    return area / (area + deficit)


@dataclass(frozen=True)
class Freezes:
    """The freezes of one reply: display gaps beyond the reader's pace (docs/qoe.md)."""

    longest_s: float  # the longest freeze (0 when the reply never froze)
    count: int  # how many freezes (gaps > FREEZE_EPSILON_S)
    total_s: float  # time frozen in all


FREEZE_EPSILON_S = 1e-6
"""Display gaps up to this much beyond the reader's pace are float noise, not freezes."""


def display_gaps(times: Sequence[float], tds: float) -> list[float]:
    """(d_k - d_(k-1)) - 1/TDS for k = 2..n, d the digestion starts of validated ``times``:
    how long the reader waited before each token after the first, beyond its own pace."""
    starts = digestion_starts(times, tds)
    return [(b - a) - 1.0 / tds for a, b in itertools.pairwise(starts)]


Spans = Sequence[tuple[float, float]]
"""``[(start, end), ...]`` seconds since the request: when the reader was away."""


def watched_times(times: Sequence[float], away: Spans) -> list[float]:
    """``times`` on the reader's watched clock, as ``qos.metrics.watched_times``: the time
    spent away before each taken out; a token that arrives while the reader is away is
    there when they come back. ValueError when the spans are malformed."""
    previous_end = -math.inf
    for start, end in away:
        if not (math.isfinite(start) and math.isfinite(end) and end >= start):
            raise ValueError("away: each span must be [start, end] with end >= start, finite")
        if start < previous_end:
            raise ValueError("away: spans must be in time order and must not overlap")
        previous_end = end
    return [t - math.fsum(min(max(t - a, 0.0), b - a) for a, b in away) for t in times]


def freezes(timeline: Entries, tds: float, away: Spans = ()) -> Freezes:
    """The freezes of ``timeline`` shown by the release rule (recursion D) at ``tds``.

    The wait for the first token is the TTFT, not a freeze; from the first token on, the
    reader is frozen whenever the next token is not there when the previous one has been
    read. ``away``: spans the reader was away; only freezes seen while watching count.
    """
    times = token_times(timeline)
    check_expectation(0.0, tds)
    return freezes_of_times(watched_times(times, away), tds)


def freezes_of_times(times: Sequence[float], tds: float) -> Freezes:
    """:func:`freezes` of validated per-token ``times``."""
    frozen = [g for g in display_gaps(times, tds) if g > FREEZE_EPSILON_S]
    if not frozen:
        return Freezes(0.0, 0, 0.0)
    return Freezes(max(frozen), len(frozen), math.fsum(frozen))


def user_idle_latency(timeline: Entries, ttft: float, tds: float) -> float:
    """User idle latency, Wang et al. Eq. 9: max_i (t_i - d_i)⁺ with deadlines
    d_i = TTFT + (i-1)/TDS; equal for the arrivals and for their release by recursion D."""
    times = token_times(timeline)
    check_expectation(ttft, tds)
    return idle_of_times(times, ttft, tds)


def idle_of_times(times: Sequence[float], ttft: float, tds: float) -> float:
    """:func:`user_idle_latency` of validated per-token ``times``."""
    return max(0.0, *(t - (ttft + k / tds) for k, t in enumerate(times)))
