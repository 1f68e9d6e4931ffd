"""The pace the reader guard protects: what a reader can notice and the engine can give.

A reader asking more than the engine gives one sequence is paced at the engine's speed
and takes no more than that of the readers' rate; a consumer of a non-reader tier
(``batch``) is not guarded at all; a wait shorter than NOTICEABLE_GAP_S is not a freeze.
"""

from __future__ import annotations

import numpy as np
import pytest

from qos.latency import LatencyProfile
from qos.policy.andes import tokenpace_andes
from qos.policy.decision import Hold
from qos.policy.reader import NOTICEABLE_GAP_S, GuardSettings, ReaderGuard
from qos.policy.table import Capacity, RequestTable

# 50 tokens/s per sequence at B=1, 25 at the full batch of 8: 200 tokens/s in all.
SMALL = LatencyProfile(
    name="small",
    source="test",
    batch_sizes=(1, 8),
    decode_s_at=(0.02, 0.04),
    kv_capacity_tokens=4_000,
    max_batch=8,
    prefill_per_token_s=2e-4,
    prefill_base_s=0.005,
)


def reply(table: RequestTable, key: str, *, tds: float, tier: str, now: float) -> int:
    """A running reply fed at the engine's pace at B=8 (a token every 0.04 s until now)."""
    row = table.add(key, arrival=0.0, prompt_tokens=20, ttft=1.0, tds=tds, tier=tier)
    table.admit(row)
    for k in range(20):
        table.record_tokens(row, now - 0.04 * (19 - k))
    return row


def fresh(table: RequestTable, key: str, *, now: float) -> int:
    return table.add(key, arrival=now - 2.0, prompt_tokens=20, ttft=1.0, tds=5.0, tier="chat")


@pytest.mark.parametrize("readers", [1, 7])
def test_a_reader_faster_than_the_engine_does_not_block_an_admission(readers):
    """Readers asking 100 tokens/s each, four times what a sequence gets at the full
    batch: counted at their full TDS, one would take half the batch's 200 tokens/s and
    two all of it. Each takes 25 (one slot's share), so seven leave room for a chat
    reader in the eighth slot, and none is held back for a deadline the engine cannot
    meet for anyone."""
    now = 10.0
    table = RequestTable()
    rows = [reply(table, f"fast{i}", tds=100.0, tier="fast", now=now) for i in range(readers)]
    newcomer = fresh(table, "new", now=now)
    policy = tokenpace_andes(SMALL, fair_share_slack=None)
    run = policy.schedule(table, Capacity(4_000, 8, pauses=True), now)
    assert run[rows].all() and run[newcomer]


def test_the_protected_pace_is_at_most_what_the_engine_gives_one_sequence():
    """A reader at 100 tokens/s fed every τ = 0.04 s is due a token τ after the last, not
    1/100 s after it: slack = τ + NOTICEABLE_GAP_S - τ, not negative."""
    now = 10.0
    table = RequestTable()
    row = reply(table, "fast", tds=100.0, tier="fast", now=now)
    slack = ReaderGuard(SMALL).slack(table, now, 0.04)
    assert slack[row] == pytest.approx(NOTICEABLE_GAP_S)


@pytest.mark.parametrize("tier", ["batch", "chat"])
def test_a_batch_consumer_is_not_guarded(tier):
    """One slot. A reply whose 20 tokens, read at 4 tokens/s, ran out 0.26 s ago is due
    if it is read (chat): it keeps the slot and the request waiting past its TTFT waits.
    A batch job's reply has no reader to keep: the waiting request gets the slot, the
    job is paused with its KV kept, and it takes nothing of the readers' rate."""
    now = 10.0
    table = RequestTable()
    row = reply(table, "job", tds=4.0, tier=tier, now=now - 4.5)
    newcomer = fresh(table, "new", now=now)
    policy = tokenpace_andes(SMALL, fair_share_slack=None)
    run = policy.schedule(table, Capacity(4_000, 1, pauses=True), now)
    assert bool(run[newcomer]) == (tier == "batch")
    assert bool(run[row]) == (tier == "chat")
    guard = ReaderGuard(SMALL)
    assert np.isinf(guard.slack(table, now, 0.04)[row]) == (tier == "batch")
    assert guard.asks(table, 25.0)[row] == (0.0 if tier == "batch" else 4.0)


@pytest.mark.parametrize("pauses", [True, False])
def test_batch_jobs_that_lost_their_kv_come_back_on_an_idle_engine(pauses):
    """Two batch jobs' replies lost their KV (801 tokens each, 1,602 together in a cache
    of 1,200) and nothing else is left. Never due, they wait for room; with nothing
    running, the engine brings back the one that fits rather than idle for ever."""
    now = 5.0
    table = RequestTable()
    jobs = []
    for key in ("a", "b"):
        row = table.add(key, arrival=0.0, prompt_tokens=700, ttft=60.0, tds=5.0, tier="batch")
        table.admit(row)
        table.record_tokens(row, 0.5, 100)
        table.preempt(row, 1.0)
        jobs.append(row)
    policy = tokenpace_andes(SMALL, fair_share_slack=None)
    run = policy.schedule(table, Capacity(1_200, 8, block_size=1, pauses=pauses), now)
    assert run[jobs].tolist() == [True, False]


def test_a_due_reply_that_lost_its_kv_does_not_push_a_due_one_out():
    """Three fast readers' replies run, 41 tokens of KV each, due at every decision (the
    engine cannot keep up with them, and a decision stands 0.1 s, as in the plugin); a
    fourth, as due, lost its KV a second ago, and the cache of 130 tokens holds three.
    Bringing it back would leave a running one out, to lose its KV and come back the
    same way at the next decision: a recompute each time and nobody served sooner. The
    three run; it waits for room."""
    now = 10.0
    table = RequestTable()
    running = [reply(table, f"fast{i}", tds=100.0, tier="fast", now=now) for i in range(3)]
    lost = reply(table, "lost", tds=100.0, tier="fast", now=now - 1.0)
    table.preempt(lost, now - 1.0)
    policy = tokenpace_andes(SMALL, fair_share_slack=None)
    capacity = Capacity(130, 8, pauses=True, decision_interval_s=0.1)
    decision = policy.decide(table, capacity, now)
    assert decision.run[running].all() and not decision.run[lost]


@pytest.mark.parametrize(("tds", "fed_until"), [(4.0, 5.96), (100.0, 10.0)])
def test_only_a_reader_a_slot_can_pace_holds_a_prefill_back(tds, fed_until):
    """A running reply with 0.1-0.3 s of slack and two requests of 1,000 prompt tokens
    (0.2 s of prefill each). A chat reader (4 tokens/s, which a slot of the full batch
    gives) cannot wait for both: the first goes in, the second waits. A reader at 100
    tokens/s, four times a slot's 25, is paced by no slot: a prefill held for it would be
    made within its reply all the same, so both go in."""
    now = 10.0
    table = RequestTable()
    row = reply(table, "reader", tds=tds, tier="chat", now=fed_until)
    first = table.add("first", arrival=now - 0.2, prompt_tokens=1_000, ttft=5.0, tds=5.0)
    second = table.add("second", arrival=now - 0.1, prompt_tokens=1_000, ttft=5.0, tds=5.0)
    policy = tokenpace_andes(SMALL, fair_share_slack=None)
    decision = policy.decide(table, Capacity(4_000, 8, pauses=True), now)
    assert policy.guard is not None
    assert 0.0 < policy.guard.slack(table, now, 0.04)[row] < 0.4
    assert decision.run[row] and decision.run[first]
    assert bool(decision.run[second]) == (tds > 25.0)
    assert decision.held_for(Hold.PREFILL) == (tds < 25.0)


def test_which_tiers_are_readers_is_a_setting():
    table = RequestTable()
    job = table.add("job", arrival=0.0, prompt_tokens=5, ttft=60.0, tds=50.0, tier="batch")
    bulk = table.add("bulk", arrival=0.0, prompt_tokens=5, ttft=60.0, tds=50.0, tier="bulk")
    assert ReaderGuard(SMALL).readers(table)[[job, bulk]].tolist() == [False, True]
    custom = ReaderGuard(SMALL, GuardSettings(non_reader_tiers=frozenset({"bulk"})))
    assert custom.readers(table)[[job, bulk]].tolist() == [True, False]


def test_a_prefill_that_would_freeze_a_reader_is_held_and_named():
    """A reader at 4 tokens/s, fed at the engine's pace and out of text 0.2 s from now
    (notices 0.3 s from now), and two requests waiting: the first prefill always goes
    in (progress); a second of 2,000 tokens (0.4 s) would make the reader wait past
    NOTICEABLE_GAP_S, so it is held, for that reason."""
    now = 10.0
    table = RequestTable()
    reader = reply(table, "reader", tds=4.0, tier="chat", now=now - 4.04)
    first = fresh(table, "first", now=now)
    big = table.add("big", arrival=now - 0.2, prompt_tokens=2_000, ttft=1.0, tds=5.0)
    decision = tokenpace_andes(SMALL, fair_share_slack=None).decide(
        table, Capacity(4_000, 8, pauses=True), now
    )
    assert decision.run[reader] and decision.run[first] and not decision.run[big]
    assert decision.holds[big] == Hold.PREFILL and decision.held == 1


def test_beside_a_reader_no_slot_paces_a_burst_goes_in_within_the_first_due_bound():
    """A chat reader with 0.1-0.3 s of slack and a reader at 100 tokens/s, whom no slot
    paces, both running; three requests waiting, of 1,000, 1,000 and 3,500 prompt tokens
    (0.2, 0.2 and 0.7 s of prefill). Split for the chat reader's slack, each later
    iteration would delay the fast reader one more prefill base, which its reply never
    makes up: two go in together, beyond the chat reader's slack, and the third, which
    would take the iteration's prefills past FIRST_DUE_PREFILL_S, waits for that reason."""
    now = 10.0
    table = RequestTable()
    chat = reply(table, "chat", tds=4.0, tier="chat", now=5.96)
    fast = reply(table, "fast", tds=100.0, tier="fast", now=now)
    waiting = [
        table.add(key, arrival=now - 0.1, prompt_tokens=tokens, ttft=5.0, tds=5.0)
        for key, tokens in (("a", 1_000), ("b", 1_000), ("c", 3_500))
    ]
    policy = tokenpace_andes(SMALL, fair_share_slack=None)
    decision = policy.decide(table, Capacity(20_000, 8, pauses=True), now)
    assert policy.guard is not None
    assert 0.0 < policy.guard.slack(table, now, 0.04)[chat] < 0.4
    assert decision.run[chat] and decision.run[fast]
    assert int(decision.run[waiting].sum()) == 2
    assert decision.held_for(Hold.PREFILL) == 1
