"""The reader guard reads the reader signals (qos/policy/reader.py, qos/policy/presence.py).

Hand-made tables check one decision each: an away reader holding its return cushion
yields its slot and its share of the readers' rate to a watching one; one short of its
cushion does not; a stated buffer or pace only ever makes a reader more patient; a row
no signal changed is scheduled exactly as without signals. The operators' gauges are
checked on the same tables.
"""

from __future__ import annotations

import numpy as np
import pytest

from qos.policy import presence
from qos.policy.andes import tokenpace_andes
from qos.policy.decision import Hold
from qos.policy.reader import ReaderGuard
from qos.policy.table import Capacity, RequestTable
from qos.signals import AWAY_LEASE_S, Presence, ReaderSignal
from tests.qos.policy.test_reader import SMALL, TAU, fresh, started

AWAY = ReaderSignal(Presence.AWAY, buffer_tokens=20)
WATCHING = ReaderSignal(Presence.WATCHING)


def due_pair(now: float) -> tuple[RequestTable, int, int]:
    """Two paused replies whose readers both run out of text now (one slot for both)."""
    table = RequestTable()
    a = started(table, "a", tokens=10, last_at=0.5, now=now)
    b = started(table, "b", tokens=10, last_at=0.5, now=now)
    table.pause(a, now)
    table.pause(b, now)
    return table, a, b


def test_an_away_reader_holding_its_cushion_yields_its_slot_to_a_watching_one():
    now = 2.45
    table, a, b = due_pair(now)
    policy = tokenpace_andes(SMALL, fair_share_slack=None)
    capacity = Capacity(2_000, 1, pauses=True)
    # without signals the tie goes to the first row; the second waits
    assert list(policy.schedule(table, capacity, now)) == [True, False]
    table.reader_signal("a", AWAY, now - 0.1)  # a's reader switched tabs with 20 unread
    run = policy.schedule(table, capacity, now)
    assert run[b] and not run[a]
    guard = policy.guard
    assert guard is not None
    assert guard.slack(table, now, TAU, guard.yielding(table, now, TAU, capacity))[a] == np.inf
    asks = guard.asks(table, 1e9, guard.yielding(table, now, TAU, capacity))
    assert asks[a] == 0.0 and asks[b] == 5.0  # it takes none of the readers' rate


@pytest.mark.parametrize("pauses", [True, False])
def test_an_away_readers_reply_lends_its_kv_where_pausing_keeps_it(pauses):
    """A reply far ahead of its reader holds 901 of 1,200 KV tokens: a fresh request of
    401 waits for room. Once its reader is away with its cushion, the room is lent to
    the fresh request where pausing keeps the KV (it stays in the cache until it is
    needed; the cushion covers a recompute on return); where leaving the reply out
    would drop its KV, it stays reserved."""
    now = 5.0
    table = RequestTable()
    parked = table.add("parked", arrival=0.0, prompt_tokens=800, ttft=1.0, tds=5.0)
    table.admit(parked)
    table.record_tokens(parked, 0.5, 100)  # its reader is busy until ~20.5 s
    table.pause(parked, 1.0) if pauses else table.preempt(parked, 1.0)
    newcomer = fresh(table, "new", arrival=now - 2.0, prompt=400)
    policy = tokenpace_andes(SMALL, fair_share_slack=None)
    capacity = Capacity(1_200, 8, block_size=1, pauses=pauses)
    assert not policy.schedule(table, capacity, now)[newcomer]
    table.reader_signal("parked", ReaderSignal(Presence.AWAY, buffer_tokens=90), now)
    assert policy.schedule(table, capacity, now)[newcomer] == pauses


@pytest.mark.parametrize(("prompt", "admitted"), [(900, True), (950, False)])
def test_an_away_readers_running_reply_lends_its_kv_but_not_its_growth(prompt, admitted):
    """A running reply holds 901 of 1,000 KV tokens and has 50 left to generate. Its
    reader is away with its cushion, so it lends its KV: a fresh request may take it,
    less the 50 tokens the reply grows by while it runs. (Where admissions took that
    growth too, they outgrew the cache under overload, and the readers who watched
    lost QoE to the away ones' recomputes: docs/benchmarks.md, "Reader signals".)"""
    now = 5.0
    table = RequestTable()
    away = table.add("away", arrival=0.0, prompt_tokens=800, ttft=1.0, tds=5.0, max_tokens=150)
    table.admit(away)
    table.record_tokens(away, 0.5, 100)  # its reader is busy until ~20.5 s
    table.reader_signal("away", ReaderSignal(Presence.AWAY, buffer_tokens=90), now)
    newcomer = fresh(table, "new", arrival=now - 0.5, prompt=prompt)
    capacity = Capacity(1_000, 8, block_size=1, pauses=True)
    policy = tokenpace_andes(SMALL, fair_share_slack=None)
    assert policy.guard is not None
    replies = policy.guard.replies(table, capacity, capacity.demand(table), now, TAU)
    assert replies.yielding[away] and not replies.reserved[away]
    assert replies.growth[away] == 50
    decision = policy.decide(table, capacity, now)
    assert decision.run[newcomer] == admitted
    assert decision.holds[newcomer] == (Hold.NONE if admitted else Hold.KV)


def test_an_away_reader_short_of_its_cushion_keeps_its_deadline():
    """Away with nothing unread: coming back, the reader would stop before the reply
    resumes, so the reply still owes it tokens."""
    now = 2.45
    table, a, _ = due_pair(now)
    table.reader_signal("a", ReaderSignal(Presence.AWAY, buffer_tokens=0), now)
    guard = ReaderGuard(SMALL)
    capacity = Capacity(2_000, 1, pauses=True)
    assert not guard.yielding(table, now, TAU, capacity)[a]
    assert guard.return_s(table, TAU, capacity)[a] * 5.0 > 0  # the cushion: a token
    run = tokenpace_andes(SMALL, fair_share_slack=None).schedule(table, capacity, now)
    assert run[a]


def test_away_without_a_stated_buffer_keeps_the_servers_model():
    now = 2.45
    table, a, _ = due_pair(now)
    table.reader_signal("a", ReaderSignal(Presence.AWAY), now)
    guard = ReaderGuard(SMALL)
    assert not guard.yielding(table, now, TAU, Capacity(2_000, 1, pauses=True))[a]


def test_the_away_lease_runs_out_without_renewal():
    now = 2.45
    table, a, _ = due_pair(now)
    table.reader_signal("a", AWAY, now)
    guard = ReaderGuard(SMALL)
    capacity = Capacity(2_000, 1, pauses=True)
    assert guard.yielding(table, now + AWAY_LEASE_S - 0.01, TAU, capacity)[a]
    assert not guard.yielding(table, now + AWAY_LEASE_S, TAU, capacity)[a]


def test_a_stated_buffer_never_makes_a_reader_due_earlier_than_the_model():
    """A client saying "watching, buffer empty" (true after a network stall, or a lie)
    gets the model's deadline: nothing over an honest client."""
    now = 1.0
    table = RequestTable()
    row = started(table, "a", tokens=10, last_at=0.5, now=now)
    guard = ReaderGuard(SMALL)
    before = guard.deadline(table, TAU).copy()
    table.reader_signal("a", ReaderSignal(Presence.WATCHING, buffer_tokens=0), now)
    assert guard.deadline(table, TAU)[row] == before[row]


def test_a_reader_back_from_away_is_due_by_the_model_never_later():
    """Away for 20 s with 8 tokens unread: back, its reply is due by the model (the
    tokens it holds are a cushion, not a reason to leave the reply's KV idle)."""
    table = RequestTable()
    row = started(table, "a", tokens=10, last_at=0.5, now=1.0)
    guard = ReaderGuard(SMALL)
    model = guard.deadline(table, TAU)[row]
    table.reader_signal("a", ReaderSignal(Presence.AWAY, buffer_tokens=8), 2.0)
    table.reader_signal("a", ReaderSignal(Presence.WATCHING, buffer_tokens=8), 22.0)
    assert guard.deadline(table, TAU)[row] == model
    assert not guard.yielding(table, 22.0, TAU, Capacity(2_000, 1, pauses=True))[row]
    assert guard.slack(table, 22.0, TAU)[row] < 0  # due: it runs at the next decision


def test_a_slower_reader_is_more_patient_and_asks_less_never_faster_than_the_tier():
    now = 1.0
    table = RequestTable()
    row = started(table, "a", tokens=10, last_at=0.5, now=now)
    guard = ReaderGuard(SMALL)
    before = guard.deadline(table, TAU)[row]
    table.reader_signal("a", ReaderSignal(Presence.WATCHING, pace_tps=2.5), now)
    assert guard.deadline(table, TAU)[row] == pytest.approx(before - 1 / 5.0 + 1 / 2.5)
    assert guard.asks(table, 1e9)[row] == 2.5
    table.reader_signal("a", ReaderSignal(Presence.WATCHING, pace_tps=50.0), now)
    assert guard.deadline(table, TAU)[row] == before and guard.asks(table, 1e9)[row] == 5.0


@pytest.mark.parametrize("pauses", [True, False])
def test_signals_that_change_nothing_leave_every_decision_as_it_was(pauses):
    """Watching, no buffer, no pace (what a client says on its first show): the guard
    decides exactly as with no signal at all."""
    now = 2.55
    tables = []
    for signal in (False, True):
        table = RequestTable()
        for k in range(6):
            started(table, f"r{k}", tokens=5 + 3 * k, last_at=0.5 + 0.2 * k, now=now)
        for k in range(4):
            fresh(table, f"f{k}", arrival=now - 0.5 * k, prompt=200)
        if signal:
            for key in table.keys:
                table.reader_signal(key, WATCHING, now - 0.1)
        tables.append(table)
    capacity = Capacity(1_500, 4, pauses=pauses)
    a, b = (tokenpace_andes(SMALL).decide(t, capacity, now) for t in tables)
    assert np.array_equal(a.run, b.run) and np.array_equal(a.holds, b.holds)
    assert a.forced == b.forced and a.preempted == b.preempted
    assert not presence.signalled(tables[1]).any()


def test_operators_see_the_share_away_and_the_rate_given_back():
    now = 2.45
    table, _, _ = due_pair(now)
    fresh(table, "new", arrival=now)  # not started: not counted
    assert presence.away_share(table, now) == 0.0
    assert presence.rate_given_back(table, now) == 0.0
    table.reader_signal("a", AWAY, now)
    assert presence.away_share(table, now) == 0.5
    assert presence.rate_given_back(table, now) == 5.0  # a's TDS
    # a cushion of 20 tokens at 5 tokens/s is 4 s of return: with more, none is counted
    assert presence.rate_given_back(table, now, return_s=4.0) == 5.0
    assert presence.rate_given_back(table, now, return_s=4.5) == 0.0
    assert presence.away_share(RequestTable(), now) == 0.0
