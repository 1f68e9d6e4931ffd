"""Readers that behave like people, and their clients' signals (qos/sim/readers.py),
against the reader guard that reads them (qos/policy/reader.py).

Whole simulated runs, small and seeded: with no reader away the signals change nothing;
readers away come back to no freeze beyond the guard's bound; a client that always says
"watching, buffer empty" gets nothing over an honest one; honest buffer reports under
network jitter add no freeze; a reader who leaves ends the reply; and on an engine whose
readers' pace binds, 30 % of readers away buys the watching ones QoE.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qos.latency import LatencyProfile
from qos.metrics import andes_qoe, freezes
from qos.policy.andes import tokenpace_andes
from qos.policy.reader import NOTICEABLE_GAP_S
from qos.signals import Presence, ReaderSignal
from qos.sim.engine import Engine, SimResult, simulate
from qos.sim.readers import ReaderModel, ReaderSim, draw_plans
from qos.sim.workload import SimRequest
from tests.qos.policy.test_reader import SMALL, freeze_bound

# one sequence at the full batch decodes 4 tokens/s, slower than a chat reader reads:
# the readers' rate, not the cache, bounds how many replies the engine can pace
SLOW = LatencyProfile(
    name="slow",
    source="test",
    batch_sizes=(1, 16),
    decode_s_at=(0.02, 0.25),
    kv_capacity_tokens=40_000,
    max_batch=16,
    prefill_per_token_s=2e-4,
    prefill_base_s=0.005,
)


def workload(n: int, rate: float, seed: int, tds: float = 4.8) -> list[SimRequest]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    return [
        SimRequest(
            f"r{i}",
            float(arrivals[i]),
            int(rng.integers(10, 200)),
            int(rng.integers(20, 150)),
            ttft=1.0,
            tds=tds,
        )
        for i in range(n)
    ]


def run(
    requests: list[SimRequest], readers: ReaderSim | None, *, profile=SMALL, pause=True
) -> SimResult:
    policy = tokenpace_andes(profile, fair_share_slack=None)
    return simulate(requests, policy, profile, pause=pause, readers=readers)


def times(result: SimResult) -> dict[str, np.ndarray]:
    return {r.id: r.times for r in result.requests}


def same(a: SimResult, b: SimResult) -> bool:
    ta, tb = times(a), times(b)
    return ta.keys() == tb.keys() and all(np.array_equal(ta[k], tb[k]) for k in ta)


@pytest.mark.parametrize("pause", [True, False])
def test_with_no_reader_away_the_signals_change_nothing(pause):
    """Watching readers only say their buffer ran dry, which never moves a deadline
    earlier than the model: every token comes when it came without signals. Readers
    away whose client says nothing change nothing either (the engine is not told)."""
    requests = workload(60, 1.5, seed=1)
    plain = run(requests, None, pause=pause)
    told = ReaderSim(requests, ReaderModel(), signals=True)
    assert same(plain, run(requests, told, pause=pause))
    untold = ReaderSim(requests, ReaderModel(away_share=0.3), signals=False)
    assert same(plain, run(requests, untold, pause=pause))


@pytest.mark.parametrize(("seed", "pause"), [(2, True), (3, True), (4, False)])
def test_away_readers_come_back_to_no_freeze_beyond_the_bound(seed, pause):
    """Half the readers go away for 2-8 s mid-reply on an overloaded engine. Their
    replies yield while they are away, and when they come back the return cushion
    covers the wait: no reply freezes while watched longer than the guard's bound, plus
    the simulated signal's way (its delay and the iteration under way when it lands)."""
    requests = workload(50, 3.0, seed=seed)
    model = ReaderModel(away_share=0.5, away_s=(2.0, 8.0), away_at=(0.0, 0.2))
    readers = ReaderSim(requests, model, signals=True, seed=seed)
    result = run(requests, readers, pause=pause)
    by_id = {r.id: r for r in requests}
    seen = [readers.outcome(by_id[r.id]) for r in result.requests]
    assert sum(o.went_away for o in seen) >= 15 and readers.sent > 0
    tau = float(SMALL.decode_s(SMALL.max_batch))
    bound = freeze_bound(SMALL, requests) + model.signal_delay_s + tau
    worst = max(o.freezes.longest_s for o in seen)
    assert worst <= bound + 1e-9, (worst, bound)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    rate=st.floats(0.5, 4.0),
    share=st.floats(0.1, 0.9),
    pause=st.booleans(),
)
def test_no_watched_freeze_beyond_the_bound_on_random_readers(seed, rate, share, pause):
    """Random workloads and readers (away 1-10 s, from the first token to the reply's
    end): with signals, no reply freezes while watched longer than the guard's bound
    plus the signal's way."""
    requests = workload(30, rate, seed=seed)
    model = ReaderModel(away_share=share, away_s=(1.0, 10.0), away_at=(0.0, 1.0))
    readers = ReaderSim(requests, model, signals=True, seed=seed)
    result = run(requests, readers, pause=pause)
    tau = float(SMALL.decode_s(SMALL.max_batch))
    bound = freeze_bound(SMALL, requests) + model.signal_delay_s + tau
    worst = max(readers.outcome(by_id(requests)[r.id]).freezes.longest_s for r in result.requests)
    assert worst <= bound + 1e-9, (worst, bound)


class Liars:
    """Clients of ``liars`` that say "watching, buffer empty" 10 times a second, from
    their first token to their last; the other clients say nothing."""

    def __init__(self, liars: set[str]) -> None:
        self.liars = liars
        self.started: set[str] = set()
        self.next_at = 0.0
        self.sent = 0

    def before_step(self, engine: Engine, now: float) -> None:
        if now < self.next_at:
            return
        self.next_at = now + 0.1
        for key in self.started & self.liars:
            self.sent += engine.table.reader_signal(key, EMPTY, now)

    def after_step(self, request_ids: list[str], end: float, finished: list[str]) -> None:
        self.started.update(request_ids)
        self.started.difference_update(finished)


EMPTY = ReaderSignal(Presence.WATCHING, buffer_tokens=0)


@pytest.mark.parametrize("profile", [SMALL, SLOW])
def test_a_client_that_lies_gets_nothing_over_an_honest_one(profile):
    """A third of the clients always say "watching, buffer empty": their replies get no
    more tokens a second and no better QoE than when the same clients said nothing."""
    requests = workload(60, 2.0, seed=5)
    liars = {r.id for r in requests[::3]}
    honest = times(run(requests, None, profile=profile))
    lying = Liars(liars)
    lied = times(run(requests, lying, profile=profile))  # type: ignore[arg-type]
    assert lying.sent > 100
    by_id = {r.id: r for r in requests}

    def rate(t: np.ndarray) -> float:
        return (t.size - 1) / (t[-1] - t[0]) if t.size > 1 else 0.0

    for key in liars:
        assert rate(lied[key]) <= rate(honest[key]) + 1e-9
        request = by_id[key]
        qoe = andes_qoe(lied[key], request.ttft, request.tds)
        assert qoe <= andes_qoe(honest[key], request.ttft, request.tds) + 1e-9


@pytest.mark.parametrize("seed", range(5))
def test_honest_buffer_reports_under_network_jitter_make_no_reply_late(seed):
    """Jitter makes honest clients report empty buffers while their tokens are on the
    wire; those reports must not make the server late for anyone. Measured on the
    server's delivery, the part scheduling controls: with reports as without, no
    watched reply falls behind its reader by a noticeable gap. (At the client the
    network's own stalls, up to seconds in this model, land on whichever tokens are on
    the wire; any change of schedule moves them, so client-side totals compared on one
    seed flip with the seed either way.)"""
    requests = workload(60, 2.0, seed=seed)
    model = ReaderModel(away_share=0.3, away_s=(2.0, 8.0), jitter_s=0.15)
    for signals in (False, True):
        readers = ReaderSim(requests, model, signals=signals, seed=seed)
        result = run(requests, readers)
        assert len(result.requests) == len(requests)
        for reply in result.requests:
            plan = readers.plans.get(reply.id)
            away = []
            if plan is not None and plan.away is not None:
                away = [(plan.away[0] - reply.arrival, plan.away[1] - reply.arrival)]
            late = freezes(reply.times, reply.tds, away=away).longest_s
            assert late <= NOTICEABLE_GAP_S, (signals, reply.id, late)


def test_a_reader_who_leaves_ends_the_reply_and_is_charged_for_what_was_generated():
    requests = workload(20, 0.5, seed=7)
    model = ReaderModel(leave_share=0.5, leave_at=(0.0, 0.02))
    readers = ReaderSim(requests, model, signals=True, seed=7)
    result = run(requests, readers, profile=SLOW)
    gone = {k for k, p in readers.plans.items() if p.leave_at is not None}
    finished = {r.id for r in result.requests}
    assert len(readers.left) >= 5 and set(readers.left) <= gone
    assert not set(readers.left) & finished  # their replies ended, not finished
    assert gone - set(readers.left) <= finished  # the others' replies ended before
    assert len(finished) == len(requests) - len(readers.left)
    for key, tokens in readers.left.items():
        assert 0 < tokens < by_id(requests)[key].output_tokens


def test_plans_are_seeded_and_leave_batch_consumers_alone():
    requests = workload(200, 1.0, seed=8)
    model = ReaderModel(away_share=0.3, leave_share=0.1)
    plans = draw_plans(requests, model, seed=8)
    assert plans == draw_plans(requests, model, seed=8)
    assert 40 <= sum(p.away is not None for p in plans.values()) <= 80
    for key, plan in plans.items():
        if plan.away is not None:
            start, end = plan.away
            assert 10.0 <= end - start <= 60.0 and start > by_id(requests)[key].arrival
    batch = [SimRequest("b", 0.0, 10, 10, ttft=60.0, tds=50.0, tier="batch")]
    assert draw_plans(batch, ReaderModel(away_share=1.0)) == {}
    with pytest.raises(ValueError, match="away_share"):
        ReaderModel(away_share=1.5)
    with pytest.raises(ValueError, match="away_s"):
        ReaderModel(away_s=(5.0, 1.0))


def by_id(requests: list[SimRequest]) -> dict[str, SimRequest]:
    return {r.id: r for r in requests}


def test_readers_away_buy_the_watching_ones_qoe_where_the_readers_pace_binds():
    """30 % of readers away for 10-60 s on an engine bound by its readers' pace: told of
    them, the guard admits into the rate they give back, and the readers' QoE, counted
    while they watch, rises."""
    requests = workload(300, 3.2, seed=9)
    model = ReaderModel(away_share=0.3)
    qoe = []
    for signals in (False, True):
        readers = ReaderSim(requests, model, signals=signals, seed=9)
        result = run(requests, readers, profile=SLOW)
        qoe.append(np.mean([readers.outcome(by_id(requests)[r.id]).qoe for r in result.requests]))
    assert qoe[1] > qoe[0] + 0.01, qoe
