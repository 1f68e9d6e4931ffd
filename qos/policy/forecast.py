"""QoE of every request at a horizon, served or not: Q_serve,i(B) and Q_wait,i (Andes §4.1).

Closed form over the digestion sums a :class:`~qos.policy.table.RequestTable` keeps
(Σ d_k and d_n, recursion D of :mod:`qos.timeline`), vectorised over all requests.

If served, request i receives tokens every τ = decode latency at batch size B, the
first at t0 (one iteration from now if running; a (re)compute prefill first if
waiting). Appended tokens j = 0..k-1 are digested from

    d_{n+j} = max(d_n + (j+1)/TDS, t0 + j·max(τ, 1/TDS))

(the recursion D solved for an arithmetic arrival sequence: a fast stream is read at
TDS, a slow one as it arrives). Both arms are arithmetic, so Σ d over the new tokens
splits at one crossing index. At the horizon h, with no arrival after h the reader
drains the buffer back to back, so

    ∫_0^h A(t) dt = n·h - Σ d_k - n/(2·TDS) + TDS·w²/2,   w = (d_n + 1/TDS - h)⁺.

The expected area is :func:`qos.timeline.expected_area` with an unknown reply length
(the scheduler does not know it). Two scores are offered: Andes Eq. 1 at the horizon
(S_actual / S_expected) and the monotone score E / (E + deficit) of
:func:`qos.metrics.monotone_qoe`, from the sums with arrivals held until the expected TTFT.

A request is *hurt by waiting* when its Q_serve is above its Q_wait by more than
:data:`HURT` (Andes Eq. 2's gain is positive). :meth:`Forecast.hurt_at` decides it for
rows at horizons of their own, by a closed form for requests with no token yet
(:func:`_fresh_hurt`) and by the forecast for the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import numpy as np

from qos.timeline import expected_area

QoEKind = Literal["andes", "monotone"]

HURT = 1e-9  # a QoE difference above float noise
_EPS = float(np.finfo(float).eps)


@dataclass(frozen=True)
class Digest:
    """Per-request digestion state, arrays over the table's rows."""

    n: np.ndarray  # tokens delivered
    total: np.ndarray  # Σ d_k
    last: np.ndarray  # d_n (table.NO_TOKEN when n = 0)
    step: np.ndarray  # 1 / TDS
    tds: np.ndarray


def digested_area_at(state: Digest, horizon: float | np.ndarray) -> np.ndarray:
    """∫_0^h A(t) dt for every request, no arrival after ``horizon``.

    For the held schedule this holds once ``horizon`` is past the hold (the expected
    TTFT); before it the expected area is 0 and :func:`score` gives 1 regardless.
    """
    drain = np.maximum(state.last + state.step - horizon, 0.0)
    area: np.ndarray = (
        state.n * horizon
        - state.total
        - 0.5 * state.n * state.step
        + 0.5 * state.tds * drain * drain
    )
    return area


def append_stream(state: Digest, t0: np.ndarray, tau: float, k: np.ndarray) -> Digest:
    """Digest state after ``k`` more tokens at t0, t0 + τ, ... (closed form, see module doc).

    With A = d_n + 1/TDS (reader arm), s = 1/TDS, S = max(τ, s) (arrival arm spacing)
    and c the first j where t0 + j·S ≥ A + j·s:
    Σ_j max(A + j·s, t0 + j·S) = k·t0 + S·k(k-1)/2 + c·(A - t0) - (S - s)·c(c-1)/2.
    """
    step = state.step
    slow = np.maximum(tau, step)
    gap = slow - step
    first = state.last + step
    with np.errstate(divide="ignore", invalid="ignore"):
        cross = np.fmax(np.fmin(np.ceil((first - t0) / gap), k), 0.0)  # nan (0/0) -> k
    total = (
        k * t0
        + slow * (k * (k - 1) * 0.5)
        + cross * (first - t0)
        - gap * (cross * (cross - 1) * 0.5)
    )
    last = np.where(k > 0, np.maximum(first + (k - 1) * step, t0 + (k - 1) * slow), state.last)
    return Digest(n=state.n + k, total=state.total + total, last=last, step=step, tds=state.tds)


def score(kind: QoEKind, actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """QoE from the actual and expected areas up to the horizon (1 where nothing was expected)."""
    return _Scorer(kind, expected)(actual)


class _Scorer:
    """:func:`score` against fixed expected areas, with the per-row constants precomputed.

    Andes: min(actual / E, 1). Monotone: E / (E + deficit), deficit = (E - actual)⁺.
    Rows with E = 0 score 1 (nothing was expected yet) without a division by zero. The
    bounds 0 and 1 are arrays: numpy's maximum/minimum against a scalar is 2x slower.
    """

    def __init__(self, kind: QoEKind, expected: np.ndarray) -> None:
        self.kind = kind
        self.expected = expected
        positive = expected > 0
        if kind == "andes":
            self.inv = 1.0 / np.where(positive, expected, np.inf)  # 0 where E = 0
            self.floor = 1.0 - positive  # lifts E = 0 rows to 1
            self.one = np.ones(expected.shape)
        else:
            self.safe = np.where(positive, expected, 1.0)  # E, or 1 where E = 0
            self.zero = np.zeros(expected.shape)

    def __call__(self, actual: np.ndarray) -> np.ndarray:
        q: np.ndarray
        if self.kind == "andes":
            q = np.minimum(actual * self.inv + self.floor, self.one)
        else:
            deficit = np.maximum(self.expected - actual, self.zero)  # 0 where E = 0: scores 1
            q = self.safe / (self.safe + deficit)
        return q


@dataclass
class Forecast:
    """The forecast for one scheduling decision: B-independent parts computed once.

    :meth:`q_serve` is :func:`append_stream` followed by :func:`digested_area_at` and
    :func:`score`, fused on these precomputed columns (one decision evaluates it for
    several batch sizes; ``tests/qos/policy/test_forecast.py`` checks the two agree). Q_wait is
    computed with them, since every objective needs it.
    """

    kind: QoEKind
    state: Digest
    now: float
    horizon: float | np.ndarray
    first_delay: np.ndarray  # seconds before a served request's first new token, beyond τ
    remaining: np.ndarray  # most tokens it can still emit (inf when unknown)
    arrival: np.ndarray
    ttft: np.ndarray
    expected: np.ndarray = field(init=False)  # expected area up to the horizon

    @classmethod
    def build(
        cls,
        *,
        kind: QoEKind,
        n: np.ndarray,
        dig_sum: np.ndarray,
        dig_last: np.ndarray,
        tds: np.ndarray,
        ttft: np.ndarray,
        arrival: np.ndarray,
        now: float,
        horizon: float,
        first_delay: np.ndarray,
        remaining: np.ndarray,
    ) -> Forecast:
        state = Digest(n=n, total=dig_sum, last=dig_last, step=1.0 / tds, tds=tds)
        return cls(kind, state, now, horizon, first_delay, remaining, arrival, ttft)

    def __post_init__(self) -> None:
        s, h = self.state, self.horizon
        zero = self._zero = np.zeros(s.step.shape)  # the bound 0 as an array: see _Scorer
        half_tds = self._half_tds = 0.5 * s.tds
        self.expected = np.asarray(expected_area(h - self.arrival, self.ttft, s.tds, np.inf))
        self._scorer = _Scorer(self.kind, self.expected)
        self._tau = np.empty(zero.shape)  # τ broadcast, filled by q_serve
        # ∫_0^h A dt = lin + k·(h - s/2) - Σ new d + (TDS/2)·drain², lin = n·h - Σ d - n·s/2
        self._h_mid = h - 0.5 * s.step
        self._lin = s.n * self._h_mid - s.total
        self._first = s.last + s.step  # the reader's next free slot, d_n + 1/TDS
        self._drain_wait = np.maximum(self._first - h, zero)  # drain with no new token
        self._start = self.first_delay + self.now  # t0 - τ
        self._reach = np.maximum(h - self._start, zero)  # k = ⌊reach / τ⌋, capped
        self._step_h = s.step - h
        # Q_wait,i: QoE at the horizon if the request gets no token before it.
        wait_area = self._lin + half_tds * self._drain_wait * self._drain_wait
        self.q_wait: np.ndarray = self._scorer(wait_area)

    def of(self, rows: np.ndarray, horizon: float | np.ndarray) -> Forecast:
        """The forecast of ``rows`` only, at another horizon (one per row, or one for all)."""
        s = self.state
        state = Digest(s.n[rows], s.total[rows], s.last[rows], s.step[rows], s.tds[rows])
        return Forecast(
            self.kind,
            state,
            self.now,
            horizon,
            self.first_delay[rows],
            self.remaining[rows],
            self.arrival[rows],
            self.ttft[rows],
        )

    def hurt(self, tau: float) -> np.ndarray:
        """Whether each request's Q_serve at τ is above its Q_wait (Andes Eq. 2's gain > 0)."""
        hurt: np.ndarray = self.q_serve(tau) - self.q_wait > HURT
        return hurt

    def hurt_at(self, rows: np.ndarray, horizon: np.ndarray, tau: float) -> np.ndarray:
        """``self.of(rows, horizon).hurt(tau)`` at per-row horizons between now and this
        forecast's (one for all): the closed form of :func:`_fresh_hurt` where it
        decides, the forecast of the rows it leaves undecided."""
        if self.kind != "andes" or not isinstance(self.horizon, float):
            return self.of(rows, horizon).hurt(tau)
        hurt, known = _fresh_hurt(self, rows, horizon, tau)
        if not known.all():
            unknown = (~known).nonzero()[0]
            hurt[unknown] = self.of(rows[unknown], horizon[unknown]).hurt(tau)
        return hurt

    @cached_property
    def q_now(self) -> np.ndarray:
        """Q_current,i: QoE so far."""
        expected_now = np.asarray(
            expected_area(self.now - self.arrival, self.ttft, self.state.tds, np.inf)
        )
        return score(self.kind, digested_area_at(self.state, self.now), expected_now)

    def q_serve(self, tau: float) -> np.ndarray:
        """Q_serve,i when every token takes τ seconds (the decode latency at batch size B).

        Tokens arrive at t0 = start + τ, t0 + τ, ... up to the horizon: k = ⌊(h - start)/τ⌋
        of them, at most ``remaining``; the sums are those of :func:`append_stream`.
        """
        step, zero = self.state.step, self._zero
        k = np.minimum(np.floor(self._reach * (1.0 / tau)), self.remaining)
        km1 = k - 1.0
        self._tau.fill(tau)
        slow = np.maximum(step, self._tau)
        gap = slow - step
        t0 = self._start + tau
        lead = self._first - t0
        with np.errstate(divide="ignore", invalid="ignore"):
            cross = np.fmax(np.fmin(np.ceil(lead / gap), k), zero)  # nan (0/0) -> k
        added = k * t0 + cross * lead + 0.5 * (slow * k * km1 - gap * cross * (cross - 1.0))
        last = np.maximum(self._first + km1 * step, t0 + km1 * slow)
        drain = np.where(k > zero, np.maximum(last + self._step_h, zero), self._drain_wait)
        area = self._lin + k * self._h_mid - added + self._half_tds * drain * drain
        return self._scorer(area)


def _fresh_hurt(
    forecast: Forecast, rows: np.ndarray, horizon: np.ndarray, tau: float
) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`Forecast.hurt` of ``rows`` at per-row horizons h (between now and the
    forecast's end, :meth:`Forecast.hurt_at`), in closed form where it decides:
    (hurt, known), ``hurt`` meaningful where ``known``. Andes (Liu et al.) Eq. 1 only.

    With E = (TDS/2)·u², u = (h - arrival - TTFT)⁺ (the expected area, Eq. 1's
    denominator) and k = min(⌊(h - start)/τ⌋, remaining) (the tokens served by h):

    - E = 0 (h not after the expected first token): both scores are 1, not hurt;
    - k = 0 (no token by h if served): both areas are the same sum, not hurt;
    - otherwise, for a request with no token yet (n = 0, so Σd = 0 and d_n = NO_TOKEN:
      the reader is free): Q_wait = 0, nothing being digested, and the first token
      alone, read at TDS from t0 = start + τ, gives ∫A ≥ (TDS/2)·m², m = min(h - t0,
      1/TDS). So it is hurt (Q_serve > 1e-9) once (TDS/2)·m² ≥ 1.1e-8·E plus twice the
      forecast's rounding error, which is below 16ε·T, T = k(|h| + |t0| + 2/TDS) +
      1.5·max(τ, 1/TDS)·k² (the size of the terms it sums); here k ≤ Δt/τ + 1, |h| and
      |t0| ≤ max(|now|, |end|) + τ, and 1/TDS is the rows' largest.

    E and k are computed as the forecast computes them, so the first two cases hold
    exactly, for any row (remaining ≥ 0). With h = min(t0 + wait, end), as
    :meth:`~qos.policy.andes.Andes.claims` asks, a fresh request is thus hurt when its
    first token after the wait lands after arrival + TTFT, and the horizon reaches past
    both. Left unknown: requests with tokens, and those whose first token's area is
    within the margin of the threshold (m under about 1e-4·u, or a clock so large that
    rounding could decide).
    """
    end = float(forecast.horizon)
    if not rows.size:
        return np.zeros(0, dtype=bool), np.ones(0, dtype=bool)
    start = forecast._start[rows]
    half_tds = forecast._half_tds[rows]
    step = forecast.state.step[rows]
    u = np.maximum(horizon - forecast.arrival[rows] - forecast.ttft[rows], 0.0)
    expected = half_tds * u * u  # as expected_area computes it
    # k ≥ 1 ⇔ ⌊(h - start)·(1/τ)⌋ ≥ 1 and remaining ≥ 1, as q_serve computes k
    live = (expected > 0.0) & (
        np.minimum((horizon - start) * (1.0 / tau), forecast.remaining[rows]) >= 1.0
    )
    ramp = np.maximum(np.minimum(horizon - (start + tau), step), 0.0)  # m
    k_max = (end - forecast.now) / tau + 1.0
    scale = max(abs(forecast.now), abs(end)) + tau
    step_max = float(step.max())
    terms = k_max * (2.0 * scale + 2.0 * step_max) + 1.5 * max(tau, step_max) * k_max**2
    sure = half_tds * ramp * ramp >= 1.1e-8 * expected + 32.0 * _EPS * terms
    hurt: np.ndarray = sure & live & (forecast.state.n[rows] == 0)
    return hurt, hurt | ~live
