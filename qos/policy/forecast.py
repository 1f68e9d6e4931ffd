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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import numpy as np

from qos.timeline import expected_area

QoEKind = Literal["andes", "monotone"]


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
            self.inv = np.divide(1.0, expected, out=np.zeros(expected.shape), where=positive)
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
    several batch sizes; ``tests/test_forecast.py`` checks the two agree). Q_wait is
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
