"""QoE of a streamed reply and the serving metrics computed from the same timeline.

Papers:
- Andes (Liu et al.) §3.1, Eq. 1: QoE = S_actual / S_expected.
- Wang et al., "Revisiting SLOs and System Level Metrics in LLM Serving" §3-§4:
  per-token deadlines, user idle latency (Eq. 9), benefit (Eq. 10), smooth goodput (Eq. 11);
  f(·) linear, quadratic or exponential per the journal version of that paper.
- Freezes: what the reader sees stop. Tokens are shown by the client buffers' release
  rule (recursion D of :mod:`qos.timeline`: the first on arrival, then
  d_k = max(t_k, d_(k-1) + 1/TDS)); a freeze is a display gap beyond the reader's pace,
  (d_k - d_(k-1)) - 1/TDS > 0. Wang et al. §4.3: users feel the longest wait, since
  "once the slowdown has occurred, catching up later does not improve the user
  experience"; Eq. 1 integrates only up to the last token and barely charges it.
- `vllm bench serve` for TTFT, TPOT, ITL, E2EL and goodput under SLOs.

All times are seconds since the request was sent; see :mod:`qos.timeline` for the
accepted timeline shapes and the digestion schedule every formula here builds on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from qos.timeline import (
    TimelineInput,
    check_expectation,
    digested_area,
    digestion_starts,
    expected_area,
    token_times,
)

IdlePenalty = Literal["linear", "quadratic", "exponential"]


def andes_qoe(
    timeline: TimelineInput,
    expected_ttft: float,
    expected_tds: float,
    *,
    ttft_penalty: float | None = None,
) -> float:
    """Andes QoE, Eq. 1, in closed form on the piecewise-linear curves.

    QoE = ∫_0^TTLT A(t) dt / ∫_0^TTLT min(T(t), l) dt, clamped to [0, 1], where A is
    the user's digestion curve (tokens digested no earlier than they arrive and no
    faster than ``expected_tds``), T(t) = TDS·(t - TTFT)⁺ the expected curve, l the
    reply length and TTLT the time of the last token. A reply fully delivered before
    the expected TTFT scores 1.

    ``ttft_penalty`` = α ∈ (0, 1] applies §3.1's variant α^(TTFT_actual - TTFT_expected)·QoE;
    the exponent is taken as its positive part, so an early first token is not a bonus.

    Faithful to Eq. 1, this can reward lateness (delaying the last token stretches
    both integrals); :func:`monotone_qoe` is the variant that never does.
    """
    times = token_times(timeline, name="timeline")
    check_expectation(expected_ttft, expected_tds)
    starts = digestion_starts(times, expected_tds)
    qoe = float(_andes(times, starts, expected_ttft, expected_tds)[0])
    if ttft_penalty is not None:
        if not 0.0 < ttft_penalty <= 1.0:
            raise ValueError(f"ttft_penalty: α must be in (0, 1], got {ttft_penalty}")
        qoe *= ttft_penalty ** max(float(times[0]) - expected_ttft, 0.0)
    return qoe


# The private measures below take validated per-token ``times``: one reply (1-D), or
# many of one length, one per row (2-D, ``expected_ttft`` and ``expected_tds`` then
# columns, one per row); each returns its figure of each reply as an array of shape
# ``times.shape[:-1] + (1,)``, the same number for a reply in a row as alone (elementwise
# arithmetic, and reductions along the last axis: :func:`replies_qoe`).
Expectation = float | np.ndarray


def _andes(
    times: np.ndarray, starts: np.ndarray, expected_ttft: Expectation, expected_tds: Expectation
) -> np.ndarray:
    """:func:`andes_qoe` (no TTFT penalty) of ``times`` whose digestion starts
    (:func:`~qos.timeline.digestion_starts`) are ``starts``."""
    ttlt = times[..., -1:]
    length = float(times.shape[-1])
    s_expected = np.asarray(expected_area(ttlt, expected_ttft, expected_tds, length))
    s_actual = np.sum(digested_area(starts, ttlt, expected_tds), axis=-1, keepdims=True)
    # everything arrived before the expected curve even started: 1
    started = s_expected > 0.0
    ratio = s_actual / np.where(started, s_expected, 1.0)
    qoe: np.ndarray = np.where(started, np.minimum(np.maximum(ratio, 0.0), 1.0), 1.0)
    return qoe


def digestion_deficit(timeline: TimelineInput, expected_ttft: float, expected_tds: float) -> float:
    """Token-seconds by which the user's reading falls behind the expected timeline.

    ∫_0^∞ (min(T(t), l) - A'(t))⁺ dt, with A' the digestion curve over the whole reply
    (not cut at TTLT). Since min(T, A) is the digestion curve of the arrivals held back
    until the expected TTFT, this equals Σ_k (d'_k - e_k): d'_k is when token k starts
    being digested with that hold, e_k = TTFT + (k-1)/TDS when it was expected to.
    Delaying any token can only move some d'_k later, so the deficit never decreases.
    """
    times = token_times(timeline, name="timeline")
    check_expectation(expected_ttft, expected_tds)
    return float(_deficit(times, expected_ttft, expected_tds)[0])


def _deficit(
    times: np.ndarray, expected_ttft: Expectation, expected_tds: Expectation
) -> np.ndarray:
    """:func:`digestion_deficit` of ``times`` (the measures' shapes, above)."""
    starts = digestion_starts(times, expected_tds, hold_until=expected_ttft)
    expected = _deadlines(times.shape[-1], expected_ttft, expected_tds)
    deficit: np.ndarray = (starts - expected).sum(axis=-1, keepdims=True)
    return deficit


def monotone_qoe(timeline: TimelineInput, expected_ttft: float, expected_tds: float) -> float:
    """QoE that delaying a token can never raise: E / (E + deficit), in (0, 1].

    E = l² / (2·TDS) is the area under the expected curve over the expected timeline
    (TTFT to TTFT + l/TDS); deficit is :func:`digestion_deficit`. 1 exactly when every
    token is digested on or ahead of schedule; 0.5 when the reading falls behind by as
    much area as the whole expected reading. See docs/qoe.md for why it exists.
    """
    times = token_times(timeline, name="timeline")
    check_expectation(expected_ttft, expected_tds)
    return float(_monotone(times, expected_ttft, expected_tds)[0])


def _monotone(
    times: np.ndarray, expected_ttft: Expectation, expected_tds: Expectation
) -> np.ndarray:
    """:func:`monotone_qoe` of ``times`` (the measures' shapes, above)."""
    n = times.shape[-1]
    area = n * n / (2.0 * np.asarray(expected_tds))
    qoe: np.ndarray = area / (area + _deficit(times, expected_ttft, expected_tds))
    return qoe


def token_deadlines(n_tokens: int, expected_ttft: float, expected_tds: float) -> np.ndarray:
    """Per-token deadlines d_i = TTFT + (i-1)/TDS (Wang et al. §3.1 Eq. 1, §3.3 reading SLO)."""
    check_expectation(expected_ttft, expected_tds)
    if n_tokens < 0:
        raise ValueError(f"n_tokens: must be >= 0, got {n_tokens}")
    return _deadlines(n_tokens, expected_ttft, expected_tds)


def _deadlines(n_tokens: int, expected_ttft: Expectation, expected_tds: Expectation) -> np.ndarray:
    deadlines: np.ndarray = expected_ttft + np.arange(n_tokens, dtype=float) / expected_tds
    return deadlines


def user_idle_latency(timeline: TimelineInput, expected_ttft: float, expected_tds: float) -> float:
    """l_r = max_i (t_i - d_i)⁺, Wang et al. Eq. 9."""
    times = token_times(timeline, name="timeline")
    check_expectation(expected_ttft, expected_tds)
    return float(_idle(times, expected_ttft, expected_tds)[0])


def _idle(times: np.ndarray, expected_ttft: Expectation, expected_tds: Expectation) -> np.ndarray:
    """:func:`user_idle_latency` of ``times`` (the measures' shapes, above)."""
    deadlines = _deadlines(times.shape[-1], expected_ttft, expected_tds)
    late = (times - deadlines).max(axis=-1, keepdims=True)
    idle: np.ndarray = np.maximum(late, 0.0)
    return idle


@dataclass(frozen=True)
class Freezes:
    """The freezes of one reply: display gaps beyond the reader's pace."""

    longest_s: float  # the longest freeze (0 when the reply never froze)
    count: int  # how many freezes (gaps > FREEZE_EPSILON_S)
    total_s: float  # time frozen in all


FREEZE_EPSILON_S = 1e-6
"""Display gaps up to this much beyond the reader's pace are float noise, not freezes."""

FREEZE_THRESHOLDS_S = (2.0, 5.0, 10.0)
"""The run-level shares report the replies whose longest freeze passes these (seconds)."""


def display_gaps(times: np.ndarray, tds: float) -> np.ndarray:
    """(d_k - d_(k-1)) - 1/TDS for k = 2..n: how long the reader waited before each token
    after the first, beyond its own pace; ``times`` validated per-token times."""
    return _gaps(digestion_starts(times, tds), tds)


def _gaps(shown: np.ndarray, tds: Expectation) -> np.ndarray:
    """:func:`display_gaps` of the tokens shown at ``shown`` (their digestion starts; the
    measures' shapes, above)."""
    gaps: np.ndarray = shown[..., 1:] - shown[..., :-1] - 1.0 / np.asarray(tds)
    return gaps


def freezes(
    timeline: TimelineInput, expected_tds: float, away: Sequence[tuple[float, float]] = ()
) -> Freezes:
    """The freezes of a reply shown by the release rule (module doc) at ``expected_tds``.

    The wait for the first token is the TTFT, not a freeze; from the first token on,
    the reader is frozen whenever the next token is not there when the previous one has
    been read. ``away``: intervals (same clock as the timeline) the reader was away (the
    tab hidden, the speech paused); the display stands still then, so only the freezes
    seen while watching count (:func:`watched_times`).
    """
    times = token_times(timeline, name="timeline")
    check_expectation(0.0, expected_tds)
    return _freezes(display_gaps(watched_times(times, away), expected_tds))[0]


def watched_times(times: np.ndarray, away: Sequence[tuple[float, float]]) -> np.ndarray:
    """``times`` on the reader's watched clock: the time spent away before each is taken
    out, and a token that arrives while the reader is away is there when they come back.
    The release rule on these times is the display of a client that stops showing while
    its reader is away (docs/protocol.md, "SDK → gateway: reader signals")."""
    if not len(away):
        return times
    intervals = np.asarray(away, dtype=float).reshape(-1, 2)
    starts, ends = intervals[:, 0], intervals[:, 1]
    if not (np.all(np.isfinite(intervals)) and np.all(ends >= starts)):
        raise ValueError("away: each interval must be [start, end] with end >= start, finite")
    if np.any(starts[1:] < ends[:-1]):
        raise ValueError("away: intervals must be in time order and must not overlap")
    # time away before t: the whole intervals that ended by t, and the part of one under way
    done = np.clip(times[:, None] - starts[None, :], 0.0, (ends - starts)[None, :])
    watched: np.ndarray = times - done.sum(axis=1)
    return watched


def _freezes(gaps: np.ndarray) -> list[Freezes]:
    """The :class:`Freezes` of each reply whose display gaps are ``gaps`` (one reply, or
    one per row); a reply's time frozen is the sum of its frozen gaps alone."""
    rows = np.atleast_2d(gaps)
    frozen = rows > FREEZE_EPSILON_S
    count = np.count_nonzero(frozen, axis=-1)
    longest = np.where(frozen, rows, 0.0).max(axis=-1, initial=0.0).tolist()
    total = [0.0] * len(longest)
    for i in np.flatnonzero(count).tolist():
        total[i] = float(rows[i][frozen[i]].sum())
    return [Freezes(*figures) for figures in zip(longest, count.tolist(), total, strict=True)]


@dataclass(frozen=True)
class ReplyQoE:
    """What is recorded of one reply: :func:`andes_qoe`, :func:`monotone_qoe`,
    :func:`freezes` and :func:`user_idle_latency`."""

    andes: float
    monotone: float
    freezes: Freezes
    idle_s: float


def reply_qoe(timeline: TimelineInput, expected_ttft: float, expected_tds: float) -> ReplyQoE:
    """The four measures of one reply, equal to the functions' own, with the timeline
    validated once and the digestion schedule (Andes Eq. 1's curve and the reader's
    display times alike) computed once: the gateway records them at the end of every
    stream. Raises ``ValueError`` as they do."""
    times = token_times(timeline, name="timeline")
    check_expectation(expected_ttft, expected_tds)
    return _replies(times, expected_ttft, expected_tds)[0]


def replies_qoe(
    times: npt.ArrayLike,
    lengths: npt.ArrayLike,
    expected_ttft: npt.ArrayLike,
    expected_tds: npt.ArrayLike,
) -> list[ReplyQoE]:
    """:func:`reply_qoe` of many replies at once, each figure the very number
    :func:`reply_qoe` gives of its reply alone: ``times`` are the replies' per-token times
    one after another, ``lengths`` their tokens, ``expected_ttft`` and ``expected_tds``
    one per reply. The replies of each length are measured together, one per row, in as
    many numpy calls as one reply takes: where a reply's few tokens make numpy's fixed
    cost the whole cost (the gateway measures the replies it relayed in batches). Raises
    ``ValueError`` as :func:`reply_qoe` does, naming the first reply refused."""
    flat = np.asarray(times, dtype=float)
    sizes = np.asarray(lengths, dtype=np.int64)
    ttft = np.asarray(expected_ttft, dtype=float)
    tds = np.asarray(expected_tds, dtype=float)
    if sizes.ndim != 1 or ttft.shape != sizes.shape or tds.shape != sizes.shape:
        raise ValueError("lengths, expected_ttft, expected_tds: one of each per reply")
    if int(sizes.sum()) != flat.size or (sizes.size and int(sizes.min()) < 1):
        raise ValueError(f"lengths: positive, and summing to the {flat.size} times given")
    firsts = np.cumsum(sizes) - sizes
    out: list[ReplyQoE | None] = [None] * sizes.size
    for n in np.unique(sizes).tolist():
        rows = np.flatnonzero(sizes == n)
        grid = flat[firsts[rows, None] + np.arange(n)]
        ttfts, tdss = ttft[rows, None], tds[rows, None]
        _check_replies(grid, ttfts, tdss, rows)
        for row, qoe in zip(rows.tolist(), _replies(grid, ttfts, tdss), strict=True):
            out[row] = qoe
    return [qoe for qoe in out if qoe is not None]


def _check_replies(times: np.ndarray, ttft: np.ndarray, tds: np.ndarray, rows: np.ndarray) -> None:
    """The checks of :func:`~qos.timeline.token_times` and
    :func:`~qos.timeline.check_expectation`, on every row of ``times`` at once (rows:
    the replies' indices, for the message)."""
    ok = (
        (times[:, 0] >= 0)
        & np.isfinite(times[:, -1])
        & (times[:, 1:] >= times[:, :-1]).all(axis=1)
        & np.isfinite(ttft[:, 0])
        & (ttft[:, 0] >= 0)
        & np.isfinite(tds[:, 0])
        & (tds[:, 0] > 0)
    )
    if not ok.all():
        bad = int(np.argmin(ok))
        name = f"replies[{int(rows[bad])}]"
        token_times(times[bad], name=name)  # raises, naming the reply, for its times
        try:
            check_expectation(float(ttft[bad, 0]), float(tds[bad, 0]))
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None


def _replies(times: np.ndarray, ttft: Expectation, tds: Expectation) -> list[ReplyQoE]:
    """:class:`ReplyQoE` of validated ``times`` (the measures' shapes, above): the
    timeline's digestion schedule computed once for Andes Eq. 1 and the display."""
    starts = digestion_starts(times, tds)
    andes = _andes(times, starts, ttft, tds).ravel().tolist()
    monotone = _monotone(times, ttft, tds).ravel().tolist()
    seen = _freezes(_gaps(starts, tds))
    idle = _idle(times, ttft, tds).ravel().tolist()
    return [ReplyQoE(*figures) for figures in zip(andes, monotone, seen, idle, strict=True)]


@dataclass(frozen=True)
class ReaderSummary:
    """What the readers of a set of replies saw: freezes and user idle latency.

    ``frozen_share[x]``: the share of replies whose longest freeze is over ``x`` seconds,
    for x in :data:`FREEZE_THRESHOLDS_S`; ``median_freeze_s``: the median longest freeze of
    the replies that froze (None if none did); idle latency is Wang et al. Eq. 9.
    """

    replies: int
    frozen_share: dict[float, float]
    longest_freeze_s: float
    median_freeze_s: float | None
    idle_p50_s: float
    idle_p99_s: float

    def as_dict(self) -> dict[str, float | int | None]:
        """Flat JSON keys: ``frozen_over_2s``, ..., ``idle_p99_s``."""
        out: dict[str, float | int | None] = {"replies": self.replies}
        out.update({f"frozen_over_{x:g}s": share for x, share in self.frozen_share.items()})
        out.update(
            longest_freeze_s=self.longest_freeze_s,
            median_freeze_s=self.median_freeze_s,
            idle_p50_s=self.idle_p50_s,
            idle_p99_s=self.idle_p99_s,
        )
        return out


def reader_summary(longest_freeze_s: Sequence[float], idle_s: Sequence[float]) -> ReaderSummary:
    """:class:`ReaderSummary` of replies given their longest freezes and idle latencies."""
    longest = np.asarray(longest_freeze_s, dtype=float)
    idle = np.asarray(idle_s, dtype=float)
    if longest.shape != idle.shape:
        raise ValueError(
            f"idle_s: {idle.size} idle latencies for {longest.size} replies; lengths must match"
        )
    if not longest.size:
        raise ValueError("longest_freeze_s: no replies to summarise")
    froze = longest[longest > FREEZE_EPSILON_S]
    return ReaderSummary(
        replies=int(longest.size),
        frozen_share={x: float(np.mean(longest > x)) for x in FREEZE_THRESHOLDS_S},
        longest_freeze_s=float(longest.max()),
        median_freeze_s=float(np.median(froze)) if froze.size else None,
        idle_p50_s=float(np.percentile(idle, 50)),
        idle_p99_s=float(np.percentile(idle, 99)),
    )


def idle_penalty(idle_s: float, kind: IdlePenalty = "linear") -> float:
    """f(l) of the benefit function: linear (default, 002), quadratic or exponential (004)."""
    if kind == "linear":
        return idle_s
    if kind == "quadratic":
        return idle_s * idle_s
    if kind == "exponential":
        return math.expm1(idle_s)
    raise ValueError(f"kind: unknown idle penalty {kind!r}; use linear, quadratic or exponential")


def request_benefit(
    timeline: TimelineInput,
    expected_ttft: float,
    expected_tds: float,
    *,
    alpha: float = 2.5,
    penalty: IdlePenalty = "linear",
) -> float:
    """benefit(r) = n_r - α·f(l_r), Wang et al. Eq. 10 (α = 2.5 as in their §5)."""
    n = token_times(timeline, name="timeline").size
    idle = user_idle_latency(timeline, expected_ttft, expected_tds)
    if penalty not in ("linear", "quadratic", "exponential"):
        raise ValueError(
            f"penalty: unknown idle penalty {penalty!r}; use linear, quadratic or exponential"
        )
    return n - alpha * idle_penalty(idle, penalty)


def smooth_goodput(benefits: Iterable[float], duration_s: float) -> float:
    """Σ_r benefit(r) / T, Wang et al. Eq. 11."""
    if not duration_s > 0:
        raise ValueError(f"duration_s: must be > 0, got {duration_s}")
    return float(sum(benefits)) / duration_s


@dataclass(frozen=True)
class ServingSLO:
    """SLOs for goodput, as `vllm bench serve --goodput ttft:MS tpot:MS e2el:MS` takes them."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None


@dataclass(frozen=True)
class RequestRecord:
    """One finished request as a benchmark client saw it."""

    prompt_tokens: int
    # (seconds since send, tokens in the chunk): pairs, or an (n, 2) array of them
    chunks: Sequence[tuple[float, int]] | npt.NDArray[np.float64]


@dataclass(frozen=True)
class ServingMetrics:
    """The metrics `vllm bench serve` prints, computed the same way (times in ms)."""

    completed: int
    total_input_tokens: int
    total_output_tokens: int
    duration_s: float
    request_throughput: float
    request_goodput: float | None
    output_throughput: float
    total_token_throughput: float
    ttft_ms: dict[str, float] = field(default_factory=dict)
    tpot_ms: dict[str, float] = field(default_factory=dict)
    itl_ms: dict[str, float] = field(default_factory=dict)
    e2el_ms: dict[str, float] = field(default_factory=dict)


def _summary(values: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    arr = np.asarray(values, dtype=float) if len(values) else np.zeros(1)
    out = {"mean": float(arr.mean()), "median": float(np.median(arr)), "std": float(arr.std())}
    out.update({f"p{p:g}": float(np.percentile(arr, p)) for p in percentiles})
    return out


def serving_metrics(
    records: Sequence[RequestRecord],
    duration_s: float,
    *,
    slo: ServingSLO | None = None,
    percentiles: Sequence[float] = (99.0,),
) -> ServingMetrics:
    """TTFT, TPOT, ITL, E2EL and goodput as `vllm bench serve` defines them.

    TTFT: first chunk's time. E2EL: last chunk's time. TPOT: (E2EL - TTFT) / (n - 1),
    only for replies of more than one token. ITL: gaps between consecutive chunks
    (vLLM measures per received chunk). A request is good when it meets every SLO given.
    """
    if not duration_s > 0:
        raise ValueError(f"duration_s: must be > 0, got {duration_s}")
    ttfts, tpots, itls, e2els, good = [], [], [], [], 0
    total_in = total_out = 0
    for rec in records:
        arr = np.asarray(rec.chunks, dtype=float).reshape(-1, 2)
        token_times(arr, name="chunks")  # validates
        times, n = arr[:, 0], int(arr[:, 1].sum())
        ttft, e2el = float(times[0]) * 1e3, float(times[-1]) * 1e3
        tpot = (e2el - ttft) / (n - 1) if n > 1 else 0.0
        ttfts.append(ttft)
        e2els.append(e2el)
        if n > 1:
            tpots.append(tpot)
        itls.extend((np.diff(times) * 1e3).tolist())
        total_in += rec.prompt_tokens
        total_out += n
        if slo is not None and all(
            limit is None or value <= limit
            for value, limit in ((ttft, slo.ttft_ms), (tpot, slo.tpot_ms), (e2el, slo.e2el_ms))
        ):
            good += 1
    return ServingMetrics(
        completed=len(records),
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        duration_s=duration_s,
        request_throughput=len(records) / duration_s,
        request_goodput=good / duration_s if slo is not None else None,
        output_throughput=total_out / duration_s,
        total_token_throughput=(total_in + total_out) / duration_s,
        ttft_ms=_summary(ttfts, percentiles),
        tpot_ms=_summary(tpots, percentiles),
        itl_ms=_summary(itls, percentiles),
        e2el_ms=_summary(e2els, percentiles),
    )
