"""Readers that behave like people, and their clients' reader signals, in the simulator.

The engine's model of a reader (:mod:`qos.policy.reader`) shows each token at the tier's
pace from the moment it is sent. Real readers depart from it, and :class:`ReaderModel`
draws how, per request, from configurable shares:

- **away**: a reader switches tabs once mid-reply (voice: pauses the speech), for a
  duration drawn uniformly from ``away_s``, starting a share drawn from ``away_at`` of
  the reply's reading time (output / TDS) after its expected first token;
- **left**: a reader leaves early, at a share drawn from ``leave_at`` of that reading
  time: the client closes the stream (the engine aborts the reply; the tenant is
  charged for what was generated, :attr:`ReaderSim.left`);
- **jitter**: every token reaches the client an exponential delay of mean ``jitter_s``
  after it was sent, in order (one stream): the client's buffer is below the model's.

:class:`ReaderSim` plays every client against an :class:`~qos.sim.engine.Engine`: it
receives the tokens, shows them by the release rule at the tier's pace, stopped while its
reader is away (the SDKs' pacers), and, with ``signals``, sends what the SDKs send
(:mod:`qos.signals`): a change of presence at once, "away" renewed every half lease,
"watching" with a buffer of 0 when the buffer runs dry with the stream open (at most
every MIN_INTERVAL_S), each with ``buffer_tokens``, "left" when the reader leaves. A signal
reaches the engine's table ``signal_delay_s`` after it was sent. Without ``signals`` the
same readers do the same, and the engine is not told (a reader who leaves still closes
the stream, as an official client's cancel does).

Measures are the reader's: freezes seen while watching (:func:`qos.metrics.freezes`
with the away interval) on the client's reception times (:meth:`ReaderSim.outcome`).
Deterministic: the draws depend only on the workload, the model and ``seed``.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from qos.metrics import Freezes, andes_qoe, freezes, user_idle_latency, watched_times
from qos.policy.reader import NON_READER_TIERS
from qos.signals import AWAY_LEASE_S, MIN_INTERVAL_S, Presence, ReaderSignal
from qos.sim.workload import SimRequest

if TYPE_CHECKING:
    from qos.sim.engine import Engine

Interval = tuple[float, float]


@dataclass(frozen=True)
class ReaderModel:
    """How the readers of a workload depart from the tier's model (module doc)."""

    away_share: float = 0.0  # readers (not batch) who go away once mid-reply
    away_s: Interval = (10.0, 60.0)  # how long, uniform
    away_at: Interval = (0.1, 0.6)  # when: of the reading time after the first token
    leave_share: float = 0.0  # readers who leave before the reply ends
    leave_at: Interval = (0.2, 0.8)  # when: of the reading time after the first token
    jitter_s: float = 0.0  # mean network delay of a token to the client
    signal_delay_s: float = 0.02  # a signal's way from the client to the engine's table

    def __post_init__(self) -> None:
        for name in ("away_share", "leave_share"):
            share = getattr(self, name)
            if not 0.0 <= share <= 1.0:
                raise ValueError(f"{name}: must be a share in [0, 1], got {share}")
        if self.away_share + self.leave_share > 1.0:
            raise ValueError("away_share + leave_share: must be at most 1 (one behaviour each)")
        for name in ("away_s", "away_at", "leave_at"):
            low, high = getattr(self, name)
            if not 0.0 <= low <= high < math.inf:
                raise ValueError(f"{name}: must be (low, high) with 0 <= low <= high, finite")
        for name in ("jitter_s", "signal_delay_s"):
            value = getattr(self, name)
            if not 0.0 <= value < math.inf:
                raise ValueError(f"{name}: must be a finite number of seconds >= 0")


@dataclass(frozen=True)
class ReaderPlan:
    """What one reader will do, on the engine clock: away over ``away`` (or never),
    leave at ``leave_at`` (or never)."""

    away: Interval | None = None
    leave_at: float | None = None


def draw_plans(
    workload: list[SimRequest], model: ReaderModel, seed: int = 0
) -> dict[str, ReaderPlan]:
    """Each request's :class:`ReaderPlan` (batch consumers watch nothing: no plan)."""
    rng = np.random.default_rng(seed)
    plans: dict[str, ReaderPlan] = {}
    for request in workload:
        draw, start, length = rng.random(), rng.uniform(0, 1), rng.uniform(0, 1)
        reading_s = request.output_tokens / request.tds
        first = request.arrival + request.ttft
        if request.tier in NON_READER_TIERS:
            continue
        if draw < model.away_share:
            at = first + _within(model.away_at, start) * reading_s
            plans[request.id] = ReaderPlan(away=(at, at + _within(model.away_s, length)))
        elif draw < model.away_share + model.leave_share:
            leave = first + _within(model.leave_at, start) * reading_s
            plans[request.id] = ReaderPlan(leave_at=leave)
    return plans


def _within(bounds: Interval, u: float) -> float:
    return bounds[0] + u * (bounds[1] - bounds[0])


@dataclass
class _Client:
    """One client: the tokens it received and when it shows them (on the watched clock)."""

    pace: float
    plan: ReaderPlan
    received: list[float] = field(default_factory=list)  # reception times, in order
    shown: list[float] = field(default_factory=list)  # display times, watched clock
    last_sent: float = -math.inf
    dry_told: bool = False  # a dry buffer was told and no token came since
    ended: bool = False  # the stream closed (the reply finished, or the reader left)

    def watched(self, t: float) -> float:
        """``t`` on the watched clock (the time away before it taken out)."""
        if self.plan.away is None:
            return t
        start, end = self.plan.away
        return t - min(max(t - start, 0.0), end - start)

    def away(self, t: float) -> bool:
        return self.plan.away is not None and self.plan.away[0] <= t < self.plan.away[1]

    def receive(self, at: float) -> None:
        at = max(at, self.received[-1]) if self.received else at
        self.received.append(at)
        shown = self.watched(at)
        if self.shown:
            shown = max(shown, self.shown[-1] + 1.0 / self.pace)
        self.shown.append(shown)
        self.dry_told = False

    def waiting(self, t: float) -> bool:
        """Whether the reader, watching at ``t``, has read every token received and
        waits for the next (a stall the server may not see)."""
        return bool(self.shown) and self.watched(t) >= self.shown[-1] + 1.0 / self.pace

    def buffer(self, t: float) -> int:
        """Tokens received by ``t`` and not yet shown."""
        received = bisect.bisect_right(self.received, t)
        return received - min(received, bisect.bisect_right(self.shown, self.watched(t)))


@dataclass(frozen=True)
class ReaderOutcome:
    """One finished reply as its reader saw it (times on the engine clock)."""

    qoe: float  # Andes QoE on the watched clock (the time away taken out)
    freezes: Freezes  # seen while watching
    idle_s: float  # user idle latency on the watched clock
    went_away: bool


class ReaderSim:
    """The clients of a workload's readers against one engine (module doc)."""

    def __init__(
        self,
        workload: list[SimRequest],
        model: ReaderModel,
        *,
        signals: bool,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.signals = signals
        self.plans = draw_plans(workload, model, seed)
        self._requests = {r.id: r for r in workload}
        self._rng = np.random.default_rng([seed, 1])
        self._clients: dict[str, _Client] = {}
        self._outbox: list[tuple[float, int, str, ReaderSignal]] = []  # (due, seq, id, signal)
        self._seq = 0
        self._next_check = 0.0
        self._open: dict[str, _Client] = {}  # clients whose stream is open
        self._away: dict[str, _Client] = {}  # those of them with an away span
        self._leaving = sorted(  # (when, id), the latest first
            ((p.leave_at, k) for k, p in self.plans.items() if p.leave_at is not None),
            reverse=True,
        )
        # readers gone before their reply ended: the tokens generated (charged)
        self.left: dict[str, int] = {}
        self.sent = 0  # signals sent

    # -- driven by :func:`qos.sim.engine.simulate` ------------------------------------
    def before_step(self, engine: Engine, now: float) -> None:
        """Play the clients up to ``now`` and hand the engine the signals due by then."""
        if self.signals:
            for key, client in list(self._away.items()):
                self._play_away(key, client, now)
            if now >= self._next_check:  # a dry buffer is told at most this often
                self._next_check = now + MIN_INTERVAL_S
                for key, client in self._open.items():
                    self._play_dry(key, client, now)
        while self._leaving and self._leaving[-1][0] <= now:
            at, key = self._leaving.pop()
            self._send(key, at, ReaderSignal(Presence.LEFT))
        self._deliver(engine, now)

    def after_step(self, request_ids: list[str], end: float, finished: list[str]) -> None:
        """The tokens of one iteration, sent at ``end``, reach their clients."""
        jitter = self.model.jitter_s
        delays = self._rng.exponential(jitter, len(request_ids)) if jitter else None
        for i, key in enumerate(request_ids):
            client = self._clients.get(key)
            if client is None:
                plan = self.plans.get(key, ReaderPlan())
                client = self._clients[key] = self._open[key] = _Client(
                    self._requests[key].tds, plan
                )
                if plan.away is not None:
                    self._away[key] = client
            client.receive(end + (float(delays[i]) if delays is not None else 0.0))
        for key in finished:
            self._end(key)

    def _end(self, key: str) -> None:
        """``key``'s stream closed: its client sends nothing more."""
        client = self._open.pop(key, None)
        self._away.pop(key, None)
        if client is not None:
            client.ended = True

    # -- the clients -------------------------------------------------------------------
    def _play_away(self, key: str, client: _Client, now: float) -> None:
        """The away span's signals sent by ``now``, in time order: "away" at its start and
        every half lease, "watching" at its end."""
        assert client.plan.away is not None
        start, end = client.plan.away
        t = start if client.last_sent < start else client.last_sent + AWAY_LEASE_S / 2
        while t < min(end, now):
            self._send(key, t, self._signal(client, Presence.AWAY, t))
            t += AWAY_LEASE_S / 2
        if start <= client.last_sent < end <= now:
            self._send(key, end, self._signal(client, Presence.WATCHING, end))
            del self._away[key]  # back: nothing more to say of the span

    def _play_dry(self, key: str, client: _Client, now: float) -> None:
        """A "watching" signal (buffer 0) when the watching reader waits for a token,
        once a dry spell."""
        if (
            not client.away(now)
            and not client.dry_told
            and now - client.last_sent >= MIN_INTERVAL_S
            and client.waiting(now)
        ):
            client.dry_told = True
            self._send(key, now, self._signal(client, Presence.WATCHING, now))

    def _signal(self, client: _Client, presence: Presence, t: float) -> ReaderSignal:
        return ReaderSignal(presence, buffer_tokens=client.buffer(t))

    def _send(self, key: str, t: float, signal: ReaderSignal) -> None:
        client = self._clients.get(key)
        if client is not None:
            client.last_sent = t
        self.sent += 1
        bisect.insort(self._outbox, (t + self.model.signal_delay_s, self._seq, key, signal))
        self._seq += 1

    def _deliver(self, engine: Engine, now: float) -> None:
        if not self._outbox or self._outbox[0][0] > now:
            return
        due = [s for s in self._outbox if s[0] <= now]
        self._outbox = [s for s in self._outbox if s[0] > now]
        table = engine.table
        for _, _, key, signal in due:
            if signal.presence is Presence.LEFT:  # the stream closes: the engine aborts
                client = self._clients.get(key)
                if client is not None and client.ended:
                    continue  # the reply ended first
                self.left[key] = int(table.col("output")[table.row(key)]) if key in table else 0
                self._end(key)
                engine.abort(key)
            else:
                table.reader_signal(key, signal, now)

    # -- measures ------------------------------------------------------------------------
    def outcome(self, request: SimRequest) -> ReaderOutcome:
        """How ``request``'s reader saw its finished reply (module doc)."""
        client = self._clients[request.id]
        times = np.asarray(client.received) - request.arrival
        plan = client.plan
        away = []
        if plan.away is not None:
            away.append((plan.away[0] - request.arrival, plan.away[1] - request.arrival))
        # the time away taken out in floating point: keep the order exact
        watched = np.maximum.accumulate(watched_times(times, away))
        return ReaderOutcome(
            qoe=andes_qoe(watched, request.ttft, request.tds),
            freezes=freezes(times, request.tds, away=away),
            idle_s=user_idle_latency(watched, request.ttft, request.tds),
            went_away=plan.away is not None,
        )
