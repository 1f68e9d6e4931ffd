"""The reader guard (qos/policy/reader.py): a started reply is never left without a token.

Hand-made tables check each rule on one decision; the simulator checks the promise over
whole runs: on random small workloads (hypothesis), under either engine (pausing with
the KV kept, or preempting by recompute), no reply ever freezes for longer than the
documented bound, one iteration with the longest single (re)compute prefill or with
a second of first prefills of requests about to pass their TTFT.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qos.latency import LatencyProfile
from qos.metrics import freezes
from qos.policy.andes import tokenpace_andes
from qos.policy.decision import Hold
from qos.policy.reader import (
    FIRST_DUE_PREFILL_S,
    GROWTH_HORIZON_S,
    NOTICEABLE_GAP_S,
    GuardSettings,
    ReaderGuard,
    chosen_guard,
)
from qos.policy.table import Capacity, RequestTable
from qos.sim.engine import simulate
from qos.sim.workload import SimRequest

# 50 tokens/s per request at B=1, 25 at B=8: a reader at 5 tokens/s is always outpaced.
SMALL = LatencyProfile(
    name="small",
    source="test",
    batch_sizes=(1, 8),
    decode_s_at=(0.02, 0.04),
    kv_capacity_tokens=2_000,
    max_batch=8,
    prefill_per_token_s=2e-4,
    prefill_base_s=0.005,
    swap_per_token_s=1e-4,
)
TAU = 0.04  # decode latency at the full batch


def started(table: RequestTable, key: str, *, tokens: int, last_at: float, now: float) -> int:
    """A running reply with ``tokens`` tokens, the last received at ``last_at``."""
    row = table.add(key, arrival=0.0, prompt_tokens=20, ttft=1.0, tds=5.0)
    table.admit(row)
    for k in range(tokens):
        table.record_tokens(row, min(last_at, 0.5 + 0.01 * k))
    assert table.col("dig_last")[row] <= now + 60.0
    return row


def fresh(table: RequestTable, key: str, *, arrival: float, prompt: int = 20) -> int:
    return table.add(key, arrival=arrival, prompt_tokens=prompt, ttft=1.0, tds=5.0)


def test_slack_is_the_time_left_before_the_reader_runs_out():
    table = RequestTable()
    row = started(table, "a", tokens=10, last_at=0.5, now=1.0)
    guard = ReaderGuard(SMALL)
    slack = guard.slack(table, 1.0, TAU)
    # 10 tokens from 0.5 s, read at 5 tokens/s: the reader runs out at 0.5 + 10/5 = 2.5 s
    # and notices it NOTICEABLE_GAP_S later
    assert slack[row] == pytest.approx(2.5 + NOTICEABLE_GAP_S - 1.0 - TAU)
    fresh(table, "b", arrival=0.9)
    assert guard.slack(table, 1.0, TAU)[1] == np.inf  # no token yet: no reader to keep
    table.preempt(row, 1.0)  # the KV is gone: its next token waits for a recompute too
    recompute = SMALL.prefill_s(int(table.context[row]))
    expected = 2.5 + NOTICEABLE_GAP_S - 1.0 - TAU - recompute
    assert guard.slack(table, 1.0, TAU)[row] == pytest.approx(expected)


@pytest.mark.parametrize("pauses", [True, False])
def test_a_reply_whose_reader_is_running_out_runs_though_fresh_requests_wait(pauses):
    """One slot: the paused reply is due (its reader ran out of text 0.05 s ago and
    notices the wait NOTICEABLE_GAP_S after that), so it runs and the fresh request,
    which the solver would rather admit, waits."""
    now = 2.55
    table = RequestTable()
    row = started(table, "due", tokens=10, last_at=0.5, now=now)  # reader out at 2.5 s
    table.pause(row, now) if pauses else table.preempt(row, now)
    newcomer = fresh(table, "new", arrival=now - 1.5)  # past its TTFT: Andes wants it
    policy = tokenpace_andes(SMALL, fair_share_slack=None)
    decision = policy.decide(table, Capacity(2_000, 1, pauses=pauses), now)
    assert decision.run[row] and not decision.run[newcomer]
    assert decision.forced == 1  # the solver would have left it out
    assert decision.holds[newcomer] == Hold.SLOTS and decision.held == 1


def test_a_reply_ahead_of_its_reader_gives_its_slot_to_a_fresh_request():
    """With pausing, the slot of a reply 20 s ahead of its reader goes to a request that
    waits for its first token; the reply keeps its KV and loses nothing."""
    now = 1.0
    table = RequestTable()
    ahead = started(table, "ahead", tokens=100, last_at=0.6, now=now)
    newcomer = fresh(table, "new", arrival=0.0)
    run = tokenpace_andes(SMALL, fair_share_slack=None).schedule(
        table, Capacity(2_000, 1, pauses=True), now
    )
    assert run[newcomer] and not run[ahead]


def test_without_pausing_a_running_reply_stays_rather_than_lose_its_kv():
    """Leaving a reply out would cost a recompute: it keeps running, the newcomer waits
    for room (the shortfall lands before the first token)."""
    now = 1.0
    table = RequestTable()
    ahead = started(table, "ahead", tokens=100, last_at=0.6, now=now)
    newcomer = fresh(table, "new", arrival=0.0)
    run = tokenpace_andes(SMALL, fair_share_slack=None).schedule(
        table, Capacity(2_000, 1, pauses=False), now
    )
    assert run[ahead] and not run[newcomer]


@pytest.mark.parametrize("pauses", [True, False])
def test_fresh_requests_get_only_the_room_every_started_reply_leaves(pauses):
    """The KV of a reply parked earlier stays counted: a fresh request that would need it
    waits, so the reply can always come back."""
    now = 5.0
    table = RequestTable()
    parked = table.add("parked", arrival=0.0, prompt_tokens=500, ttft=1.0, tds=5.0)
    table.admit(parked)
    for k in range(100):
        table.record_tokens(parked, 0.5 + 0.01 * k)  # its reader is busy until ~20.5 s
    table.preempt(parked, 1.0)
    newcomer = fresh(table, "new", arrival=now - 2.0, prompt=1_000)
    policy = tokenpace_andes(SMALL, fair_share_slack=None)
    run = policy.schedule(table, Capacity(1_200, 8, block_size=1, pauses=pauses), now)
    assert not run[newcomer]  # 601 + 1001 > 0.95 * 1200: it would take the parked reply's KV
    small = fresh(table, "small", arrival=now - 2.0, prompt=400)
    run = policy.schedule(table, Capacity(1_200, 8, block_size=1, pauses=pauses), now)
    assert run[small] and not run[newcomer]  # 601 + 401 fits beside it


@pytest.mark.parametrize("readers", [9, 10])
def test_fresh_requests_wait_while_the_readers_ask_all_the_engine_decodes(readers):
    """One slot decodes 50 tokens/s (SMALL at B=1): ten readers at 5 tokens/s take all of
    it. Every reply is far ahead of its reader and the cache has room, so slots and KV
    alone would admit the newcomer; the reader-rate room admits it beside nine readers,
    not beside ten (the batch could not pace eleven, whoever got the slot)."""
    now = 1.0
    table = RequestTable()
    replies = [started(table, f"r{i}", tokens=100, last_at=0.6, now=now) for i in range(readers)]
    for row in replies[1:]:
        table.pause(row, now)
    newcomer = fresh(table, "new", arrival=0.0)
    policy = tokenpace_andes(SMALL, fair_share_slack=None)
    decision = policy.decide(table, Capacity(2_000, 1, pauses=True), now)
    assert bool(decision.run[newcomer]) == (readers == 9)
    assert decision.held_for(Hold.READERS_RATE) == (readers == 10)


@pytest.mark.parametrize("swap_s_per_token", [1e-4, 1e-2])
def test_the_loans_swaps_count_against_the_readers_rate(swap_s_per_token):
    """Twenty replies far ahead of their readers (100 tokens each, read until about 20 s)
    lend their KV after 10 s of slack: the cache to its watermark (1,800 tokens) holds 14
    of them, so 620 tokens are out on loan, moved out and back every ~5 s (lent at 10 s
    of slack, back from 5 s). At SMALL's 1e-4 s a token that is 2.5 % of the engine's
    time and the newcomer goes in; at 1e-2 s it is more than all of it, and the
    newcomer waits (there is room in the cache and readers' rate to spare otherwise: 20
    readers ask 100 of the 200 tokens/s the batch decodes)."""
    now = 1.0
    profile = dataclasses.replace(SMALL, swap_per_token_s=swap_s_per_token)
    table = RequestTable()
    replies = [started(table, f"r{i}", tokens=100, last_at=0.6, now=now) for i in range(20)]
    for row in replies:
        table.pause(row, now)
    newcomer = fresh(table, "new", arrival=0.0)
    policy = tokenpace_andes(profile, fair_share_slack=None, guard=GuardSettings(lend_after_s=10.0))
    run = policy.schedule(table, Capacity(2_000, 8, pauses=True), now)
    assert policy.guard is not None
    margin = policy.guard.margin_s(TAU, Capacity(2_000, 8))
    share = policy.guard.loan_share(20 * 121, 1_800, margin)
    assert share == pytest.approx(620 * 2 * swap_s_per_token / (5.0 - 0.09))
    assert bool(run[newcomer]) == (swap_s_per_token == 1e-4)


@pytest.mark.parametrize(
    ("tokens", "lend_after_s", "back"), [(20, 10.0, True), (40, 10.0, False), (20, None, False)]
)
def test_a_lender_halfway_due_comes_back_into_the_kv_of_one_that_would_lend(
    tokens, lend_after_s, back
):
    """A cache of 150 tokens holds one of two replies: "ahead" (121 tokens, its reader
    busy for 19 s) has its KV, "lent" (41) lost its. With lending after 10 s, "lent"
    comes back once its slack is half that (20 tokens: about 3 s), pushing out "ahead",
    which would lend its KV anyway; not with 40 tokens (7 s), and not without lending,
    where "lent" waits for room until it is due."""
    now = 1.0
    table = RequestTable()
    ahead = started(table, "ahead", tokens=100, last_at=0.6, now=now)
    table.pause(ahead, now)
    lent = started(table, "lent", tokens=tokens, last_at=0.6, now=now)
    table.preempt(lent, now)
    policy = tokenpace_andes(
        SMALL, fair_share_slack=None, guard=GuardSettings(lend_after_s=lend_after_s)
    )
    run = policy.schedule(table, Capacity(150, 8, pauses=True), now)
    assert policy.guard is not None
    slack = policy.guard.slack(table, now, TAU)
    assert slack[ahead] > 10.0 and 0.1 < slack[lent] < 10.0
    assert (bool(run[lent]), bool(run[ahead])) == (back, not back)


@pytest.mark.parametrize("waited", [0.1, 1.1])
def test_an_admission_waits_when_its_prefill_would_freeze_a_running_reply(waited):
    """A running reply with 0.2 s of slack (its reader out of text at 2.5 s, noticing
    at 2.6 s) cannot wait for a 0.2 s prefill beside another: the first admission of an
    iteration always goes in, the next one waits, unless it has waited past its TTFT
    (1 s): its user is waiting too, and it goes in all the same."""
    now = 2.4
    table = RequestTable()
    reply = started(table, "tight", tokens=10, last_at=0.5, now=now)  # out at 2.5 s
    first = fresh(table, "first", arrival=now - 1.2, prompt=100)
    second = fresh(table, "second", arrival=now - waited, prompt=1_000)
    decision = tokenpace_andes(SMALL, fair_share_slack=None).decide(
        table, Capacity(2_000, 8, pauses=True), now
    )
    assert decision.run[reply] and decision.run[first]
    assert bool(decision.run[second]) == (waited > 1.0)
    assert decision.held_for(Hold.PREFILL) == (waited < 1.0)


def test_a_burst_past_its_ttft_takes_at_most_a_second_of_prefill_an_iteration():
    """Four requests, 2,000 prompt tokens each (0.4 s of prefill), have waited past their
    TTFT beside a running reply with 0.2 s of slack. Their users are waiting too, so
    their prefills go in beyond the reply's slack, but only FIRST_DUE_PREFILL_S of them
    an iteration: two (0.81 s), not all four (1.6 s, which the reply's reader would
    wait on whole)."""
    now = 2.4
    table = RequestTable()
    reply = started(table, "tight", tokens=10, last_at=0.5, now=now)  # out at 2.5 s
    burst = [fresh(table, f"burst{i}", arrival=now - 1.1, prompt=2_000) for i in range(4)]
    decision = tokenpace_andes(SMALL, fair_share_slack=None).decide(
        table, Capacity(20_000, 8, pauses=True), now
    )
    assert decision.run[reply]
    assert decision.run[burst].tolist() == [True, True, False, False]
    assert decision.held_for(Hold.PREFILL) == 2
    assert 2 * (0.4 + SMALL.prefill_base_s) <= FIRST_DUE_PREFILL_S < 3 * 0.4


@pytest.mark.parametrize("pauses", [True, False])
def test_the_room_keeps_the_blocks_the_running_replies_open_before_the_next_decision(pauses):
    """A running reply fills its 16 blocks of 16 tokens, one token left to generate: its
    last token opens a 17th block, which the engine allocates whole. A fresh request of
    7 blocks would fit the cache of 380 tokens beside 16 blocks and one token, but not
    beside 17 blocks: it waits."""
    now = 5.0
    capacity = Capacity(380, 8, block_size=16, pauses=pauses)
    table = RequestTable()
    reply = table.add("reply", arrival=0.0, prompt_tokens=250, ttft=1.0, tds=5.0, max_tokens=6)
    table.admit(reply)
    for _ in range(5):
        table.record_tokens(reply, now - 0.1)
    newcomer = fresh(table, "new", arrival=now - 0.1, prompt=100)
    fresh(table, "too-long", arrival=now - 0.1, prompt=299)  # fits nowhere: the solver runs
    assert capacity.demand(table)[[reply, newcomer]].tolist() == [256, 112]
    assert 256 + 1 + 112 <= 380 < 256 + 16 + 112
    decision = tokenpace_andes(SMALL, fair_share_slack=None).decide(table, capacity, now)
    assert decision.run[reply] and not decision.run[newcomer]
    assert decision.holds[newcomer] == Hold.KV


def reply_near_full(
    table: RequestTable, now: float, max_tokens: int | None = 10, *, shown: int = 5
) -> int:
    """A running reply of 880 prompt tokens with ``shown`` tokens received at ``now`` -
    0.1 s (``max_tokens`` - ``shown`` left to generate): with 5, its reader is busy until
    5.7 s and can wait out a recompute; with 1, it cannot."""
    reply = table.add(
        "reply", arrival=0.0, prompt_tokens=880, ttft=1.0, tds=5.0, max_tokens=max_tokens
    )
    table.admit(reply)
    for _ in range(shown):
        table.record_tokens(reply, now - 0.1)
    return reply


@pytest.mark.parametrize(("waited", "runs"), [(0.6, [True] * 3), (0.0, [True, False, False])])
def test_a_burst_is_due_once_the_prefills_in_line_would_take_it_past_its_ttft(waited, runs):
    """Three requests of 1,000 prompt tokens (0.2 s of prefill each) beside a running reply
    with 0.2 s of slack. Arrived 0.6 s ago, the first is 0.4 s from its TTFT, past the
    margin, but the second and third would pass theirs behind the prefills before them
    (0.41 s, 0.61 s): their users are about to wait too, and their prefills go in. Arrived
    just now, none is near its TTFT: the first goes in (an iteration's first prefill
    always does) and the others wait for the reply's slack."""
    now = 2.4
    table = RequestTable()
    reply = started(table, "tight", tokens=10, last_at=0.5, now=now)  # out at 2.5 s
    burst = [fresh(table, f"burst{i}", arrival=now - waited, prompt=1_000) for i in range(3)]
    policy = tokenpace_andes(SMALL, fair_share_slack=None)
    decision = policy.decide(table, Capacity(20_000, 8, pauses=True), now)
    assert decision.run[reply] and decision.run[burst].tolist() == runs
    assert decision.held_for(Hold.PREFILL) == runs.count(False)
    assert policy.guard is not None
    slack = policy.guard.ttft_slack(table, np.array(burst), now)
    margin = policy.guard.margin_s(TAU, Capacity(20_000, 8))
    assert (slack <= margin).tolist() == [False, waited > 0, waited > 0]


@pytest.mark.parametrize("pauses", [True, False])
def test_a_fresh_request_takes_the_cache_less_the_replies_growth(pauses):
    """A running reply holds 886 of 1,000 KV tokens and grows by 5 more (its length is
    known): a fresh request of 81 takes what is left, with no share of the cache kept
    above it (FCFS fills the cache too); a second waits for room."""
    now = 5.0
    capacity = Capacity(1_000, 8, block_size=1, pauses=pauses)
    table = RequestTable()
    reply = reply_near_full(table, now)
    first = fresh(table, "first", arrival=now - 0.2, prompt=80)
    second = fresh(table, "second", arrival=now - 0.1, prompt=80)
    assert capacity.demand(table)[[reply, first]].sum() == 967  # + 5 of growth <= 1,000
    decision = tokenpace_andes(SMALL, fair_share_slack=None).decide(table, capacity, now)
    assert decision.run[reply] and decision.run[first]
    assert not decision.run[second] and decision.holds[second] == Hold.KV


@pytest.mark.parametrize("pauses", [True, False])
@pytest.mark.parametrize(("shown", "admitted"), [(5, True), (1, False)])
def test_a_reply_that_cannot_wait_out_a_recompute_keeps_its_growth_free_longer(
    pauses, shown, admitted
):
    """The reply's length unknown. With its reader busy for 0.7 s, it could wait out a
    recompute should it outgrow the cache: the room keeps its growth over
    GROWTH_HORIZON_S free (one token an iteration), and a fresh request of 81 goes in.
    With its reader about to run dry, it could not: GROWTH_HORIZON_S more of its growth
    stays free, should the next completion come late, and the request waits."""
    now = 5.0
    table = RequestTable()
    reply = reply_near_full(table, now, max_tokens=None, shown=shown)
    request = fresh(table, "request", arrival=now - 0.1, prompt=80)
    tau = float(SMALL.decode_s(table.n))  # both fit the solver's watermark: no solve
    grows = math.ceil(GROWTH_HORIZON_S / tau)
    held = int(table.context[reply]) + 1
    capacity = Capacity(held + grows + 81 + grows // 2, 8, block_size=1, pauses=pauses)
    policy = tokenpace_andes(SMALL, fair_share_slack=None)
    assert policy.guard is not None and not policy.triggered(table, capacity)
    replies = policy.guard.replies(table, capacity, capacity.demand(table), now, tau)
    assert replies.short[reply] == (not admitted)
    decision = policy.decide(table, capacity, now)
    assert decision.run[reply] and decision.run[request] == admitted
    assert decision.holds[request] == (Hold.NONE if admitted else Hold.KV)


def test_overdue_requests_go_first_oldest_first():
    guard = ReaderGuard(SMALL, GuardSettings(overdue_after_ttfts=10.0))
    table = RequestTable()
    for key, arrival in (("young", 95.0), ("old", 50.0), ("older", 20.0), ("mid", 99.0)):
        fresh(table, key, arrival=arrival)
    policy_order = np.array([0, 3, 1, 2])  # as a policy ranked them
    # at 100 s: old (50 s) and older (80 s) have waited more than 10 TTFTs of 1 s
    overdue, others = guard.overdue(table, policy_order, 100.0)
    assert overdue.tolist() == [2, 1] and others.tolist() == [0, 3]
    overdue, others = ReaderGuard(SMALL, GuardSettings(overdue_after_ttfts=None)).overdue(
        table, policy_order, 100.0
    )
    assert overdue.size == 0 and others.tolist() == policy_order.tolist()


def test_under_a_long_queue_a_request_is_overdue_only_past_its_multiple_of_fcfs_wait():
    """With 4 requests waiting and a reply ending every 10 s, FCFS would make a request
    arriving now wait 40 s: within 1.25 times that (the default) the policy's order
    stands, past it the oldest go first."""
    guard = ReaderGuard(SMALL, GuardSettings(overdue_after_ttfts=10.0))
    table = RequestTable()
    for key, arrival in (("young", 95.0), ("waited-49", 51.0), ("waited-51", 49.0), ("mid", 99.0)):
        fresh(table, key, arrival=arrival)
    policy_order = np.array([0, 3, 1, 2])
    overdue, others = guard.overdue(table, policy_order, 100.0, room_wait_s=10.0)
    assert overdue.tolist() == [2] and others.tolist() == [0, 3, 1]
    overdue, _ = guard.overdue(table, policy_order, 100.0, room_wait_s=0.1)  # short queue
    assert overdue.tolist() == [2, 1]
    ttfts_only = ReaderGuard(
        SMALL, GuardSettings(overdue_after_ttfts=10.0, overdue_after_fcfs_waits=0.0)
    )
    overdue, _ = ttfts_only.overdue(table, policy_order, 100.0, room_wait_s=10.0)
    assert overdue.tolist() == [2, 1]


def test_an_overdue_request_that_does_not_fit_holds_the_room_for_itself():
    """Overdue requests are admitted in line: smaller, fresher ones do not slip past an
    old long prompt and starve it."""
    now = 100.0
    table = RequestTable()
    old_long = fresh(table, "old-long", arrival=10.0, prompt=1_500)
    young = fresh(table, "young", arrival=99.5, prompt=50)
    policy = tokenpace_andes(SMALL, fair_share_slack=None)
    holder = started(table, "holder", tokens=400, last_at=1.0, now=now)  # reader busy
    table.col("prompt")[holder] = 600  # holds 1,000 tokens of the cache
    run = policy.schedule(table, Capacity(2_000, 8, block_size=1, pauses=True), now)
    assert run[holder] and not run[old_long] and not run[young]


def test_bad_options_are_refused_naming_the_option():
    with pytest.raises(ValueError, match="margin_s"):
        GuardSettings(margin_s=0.0)
    with pytest.raises(ValueError, match="overdue_after_ttfts"):
        GuardSettings(overdue_after_ttfts=-1.0)
    with pytest.raises(ValueError, match="overdue_after_fcfs_waits"):
        GuardSettings(overdue_after_fcfs_waits=-0.5)
    with pytest.raises(ValueError, match="overdue_after_fcfs_waits"):
        GuardSettings(overdue_after_fcfs_waits=float("inf"))
    with pytest.raises(ValueError, match="lend_after_s"):
        GuardSettings(lend_after_s=0.0)


def test_a_configuration_chooses_the_settings_it_names_and_inf_turns_a_rule_off():
    assert chosen_guard() is None  # nothing set: nothing for a policy without the guard
    default = GuardSettings()
    assert chosen_guard(lend_after_s=30.0) == dataclasses.replace(default, lend_after_s=30.0)
    assert chosen_guard(overdue_after_ttfts=math.inf) == dataclasses.replace(
        default, overdue_after_ttfts=None
    )
    assert chosen_guard(lend_after_s=math.inf) == default  # off, as by default
    waits = chosen_guard(overdue_after_fcfs_waits=0.0)
    assert waits == dataclasses.replace(default, overdue_after_fcfs_waits=0.0)
    with pytest.raises(ValueError, match="overdue_after_fcfs_waits"):
        chosen_guard(overdue_after_fcfs_waits=math.inf)  # a multiple, with no off
    with pytest.raises(ValueError, match="lend_after_s"):
        chosen_guard(lend_after_s=-1.0)


def freeze_bound(profile: LatencyProfile, workload: list[SimRequest]) -> float:
    """The documented bound (docs/architecture/policy.md, "The reader guard"): one iteration at
    the full batch with the longest single (re)compute prefill, a whole context's, or with
    the first prefills of requests about to pass their TTFT (FIRST_DUE_PREFILL_S at most,
    and no more than all of the workload's prompts)."""
    longest = max(r.prompt_tokens + r.output_tokens for r in workload)
    firsts = sum(profile.prefill_s(r.prompt_tokens) for r in workload)
    tau = float(profile.decode_s(profile.max_batch))
    return tau + max(profile.prefill_s(longest), min(firsts, FIRST_DUE_PREFILL_S))


workloads = st.lists(
    st.tuples(
        st.floats(0.0, 20.0),  # arrival
        st.integers(1, 300),  # prompt tokens
        st.integers(1, 300),  # output tokens
        st.sampled_from([3.3, 4.8, 25.0]),  # TDS: voice, chat, fast
        st.sampled_from([("free", 1.0), ("pro", 2.0), ("ent", 4.0)]),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(spec=workloads, pauses=st.booleans(), weighted=st.booleans())
def test_no_reply_freezes_beyond_the_bound_on_random_workloads(spec, pauses, weighted):
    workload = [
        SimRequest(
            id=f"r{i}",
            arrival=arrival,
            prompt_tokens=prompt,
            output_tokens=output,
            ttft=1.0,
            tds=tds,
            tenant=tenant,
            weight=weight,
        )
        for i, (arrival, prompt, output, tds, (tenant, weight)) in enumerate(spec)
    ]
    policy = tokenpace_andes(SMALL, fair_share_slack=500.0 if weighted else None)
    result = simulate(workload, policy, SMALL, pause=pauses)
    bound = freeze_bound(SMALL, workload)
    worst = max(freezes(r.times, r.tds).longest_s for r in result.requests)
    assert worst <= bound + 1e-9, (worst, bound)


def test_an_idle_engine_admits_a_request_the_plans_would_keep_waiting():
    """A weight-1 request beyond its guarantee, behind the room the plans keep for the
    weight-4 and weight-2 tenants that just sent: once their replies end it runs on the
    empty engine rather than waiting for their memory to lapse (the simulator raises on
    an engine left idle with a request waiting)."""
    sent = [("ent", 4.0, 87), ("ent", 4.0, 124), ("ent", 4.0, 135), ("pro", 2.0, 199)]
    sent += [("ent", 4.0, 252), ("ent", 4.0, 254), ("free", 1.0, 272)]
    workload = [
        SimRequest(f"{tenant}{i}", 0.0, prompt, 1, ttft=1.0, tds=3.3, tenant=tenant, weight=w)
        for i, (tenant, w, prompt) in enumerate(sent)
    ]
    policy = tokenpace_andes(SMALL, fair_share_slack=500.0)
    result = simulate(workload, policy, SMALL, pause=False)
    last = max(r.times[-1] for r in result.requests)
    assert last < 1.0


@pytest.mark.parametrize("also_out", [False, True])
def test_a_reply_that_lost_its_kv_comes_back_early_only_while_every_reply_fits(also_out):
    """2,000 KV tokens: a paused reply holds 951; one of 951 lost its KV, 10 s ahead of
    its reader, and would fit beside it. It comes back at once, unless another lost reply
    (500) means the committed replies hold more than the cache: then bringing it back
    early would only push a paused one out later, a recompute each way, so it waits
    until its reader needs it."""
    now, table = 20.0, RequestTable()
    policy = tokenpace_andes(SMALL, fair_share_slack=None)
    rows = {}
    for key, prompt in [("kept", 900), ("lost", 900)] + [("other", 450)] * also_out:
        row = table.add(key, arrival=0.0, prompt_tokens=prompt, ttft=1.0, tds=5.0)
        table.admit(row)
        table.record_tokens(row, now - 0.1, 50)  # 50 tokens to read: 10 s
        table.pause(row, now - 0.1) if key == "kept" else table.preempt(row, now - 0.1)
        rows[key] = row
    run = policy.schedule(table, Capacity(2_000, 8, pauses=True), now)
    back = [key for key, row in rows.items() if run[row]]
    assert back == (["kept"] if also_out else ["kept", "lost"])
