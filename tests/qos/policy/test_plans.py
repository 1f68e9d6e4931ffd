"""Price plans (qos/policy/plans.py): weights decide who absorbs a shortfall."""

from __future__ import annotations

import numpy as np
import pytest

from qos.latency import LatencyProfile
from qos.policy import plans
from qos.policy.andes import tokenpace_andes
from qos.policy.reader import NOTICEABLE_GAP_S
from qos.policy.table import Capacity, RequestTable
from qos.sim.engine import SimResult, simulate
from qos.sim.workload import SimRequest


def add(table: RequestTable, key: str, tenant: str, weight: float, prompt: int) -> int:
    return table.add(
        key, arrival=0.0, prompt_tokens=prompt, ttft=1.0, tds=5.0, tenant=tenant, weight=weight
    )


def test_a_request_is_within_plan_while_its_tenant_stays_within_its_share():
    """Free (w 1) holds 601 and waits with 101 and 201 more; ent (w 4) wants 300. Room
    1,000: ent's share is 300 (all it wants), free's the other 700, which its hold
    already passes. Room 1,100: free's share is 800, its first request fits."""
    table = RequestTable()
    held = add(table, "held", "free", 1.0, 599)
    table.admit(held)
    table.record_tokens(held, 0.5)  # 600 in context, 601 with its next token
    first = add(table, "f1", "free", 1.0, 100)
    second = add(table, "f2", "free", 1.0, 200)
    ent = add(table, "e1", "ent", 4.0, 299)
    committed = table.running | (table.col("output") > 0)
    waiting = np.array([first, second, ent])
    within = plans.within_plan(table, waiting, committed, table.demand, 1_000)
    assert within.tolist() == [False, False, True]  # free: 601 + 101 > 700
    assert plans.within_plan(table, waiting, committed, table.demand, 1_100).tolist() == [
        True,
        False,
        True,  # free's share 800: 601 + 101 fits, + 201 more does not
    ]
    assert plans.by_weight(table, waiting).tolist() == [ent, first, second]
    nobody = np.zeros(0)
    assert plans.weighted(table, committed | np.isin(np.arange(table.n), waiting), nobody)
    assert not plans.weighted(table, committed, nobody)  # one tenant present
    recent = np.array([0.0, 4.0])  # ent sent within the plans' memory
    assert plans.weighted(table, committed, recent)


# 50 tokens/s per request at B=1, 25 at B=8; 1,500 KV tokens: about 5 replies at a time.
SMALL = LatencyProfile(
    name="small",
    source="test",
    batch_sizes=(1, 8),
    decode_s_at=(0.02, 0.04),
    kv_capacity_tokens=1_500,
    max_batch=8,
    prefill_per_token_s=2e-4,
    prefill_base_s=0.005,
)


def flood(seed: int = 0) -> list[SimRequest]:
    """The weight-1 tenant sends ten times what the engine carries; the weight-4 tenant a
    request every 4 s, well within its share."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(120):
        out.append(
            SimRequest(
                id=f"free{i}",
                arrival=float(i) * 0.1,
                prompt_tokens=100,
                output_tokens=int(rng.integers(100, 200)),
                ttft=1.0,
                tds=5.0,
                tenant="free",
                weight=1.0,
            )
        )
    for i in range(3):
        out.append(
            SimRequest(
                id=f"ent{i}",
                arrival=2.0 + 4.0 * i,
                prompt_tokens=100,
                output_tokens=150,
                ttft=1.0,
                tds=5.0,
                tenant="ent",
                weight=4.0,
            )
        )
    return out


@pytest.mark.parametrize("pause", [True, False])
def test_a_tenant_within_its_plan_is_served_whatever_a_flood_of_another_sends(pause):
    workload = flood()
    weighted = simulate(
        workload, tokenpace_andes(SMALL, fair_share_slack=500.0), SMALL, pause=pause
    )
    blind = simulate(workload, tokenpace_andes(SMALL, fair_share_slack=None), SMALL, pause=pause)
    ent = {r.id: r for r in weighted.requests if r.tenant == "ent"}
    blind_ent = {r.id: r for r in blind.requests if r.tenant == "ent"}
    # its first request after a quiet spell finds no room kept (its tenant sent
    # nothing) and waits, less than without plans; where pausing keeps the KV (as the
    # plugin runs it) it takes back borrowed KV after half its TTFT, and the ones
    # after it find the room its plan keeps: each is served within about a TTFT
    assert ent["ent0"].actual_ttft < blind_ent["ent0"].actual_ttft
    if pause:  # without pausing, the replies' growth eats the room
        assert all(r.actual_ttft < 1.5 for r in ent.values())
    assert sum(r.andes_qoe for r in ent.values()) > sum(r.andes_qoe for r in blind_ent.values())
    # nobody pays with a freeze a reader could notice
    assert all(r.freezes.longest_s <= NOTICEABLE_GAP_S for r in weighted.requests)


def borrowed_cache(*, waited: float, unread: int) -> tuple[bool, list[int]]:
    """Weights 1 : 4 on SMALL's 1,500 KV tokens. The weight-1 tenant's three paused
    replies hold 1,353, far beyond its guarantee (300), ``unread`` tokens ahead of their
    readers each; a weight-4 request of 301, within its guarantee, arrived ``waited``
    seconds ago (its TTFT is 1 s) and finds no room. Whether it runs now, and which rows
    keep running or paused."""
    now, table = 100.0, RequestTable()
    policy = tokenpace_andes(SMALL, fair_share_slack=500.0)
    for i in range(3):
        row = add(table, f"free{i}", "free", 1.0, 400)
        policy.on_arrival(table, row, now - 10.0)
        table.admit(row)
        # 50 tokens, shown at 5 tokens/s from (unread - 50) / 5 s before now: the last of
        # them, the unread-th from now, is shown (unread - 1) / 5 s from now
        table.record_tokens(row, now + (unread - 50) / 5.0, 50)
        table.pause(row, now - 0.5)
    ent = table.add(
        "ent", arrival=now - waited, prompt_tokens=300, ttft=1.0, tds=5.0, tenant="ent", weight=4.0
    )
    policy.on_arrival(table, ent, now - waited)
    run = policy.schedule(table, Capacity(1_500, 8, pauses=True), now)
    return bool(run[ent]), [int(r) for r in np.flatnonzero(run) if r != ent]


@pytest.mark.parametrize(
    ("waited", "unread", "takes_back"),
    [(0.6, 50, True), (0.3, 50, False), (0.6, 4, False)],
)
def test_a_request_within_its_guarantee_takes_back_borrowed_kv_after_half_its_ttft(
    waited, unread, takes_back
):
    """It runs once it has waited half its TTFT and the borrowed replies' readers have
    10 s to read: one of them gives its slot and its KV (the engine drops it; it is
    recomputed when due). It waits before that (a reply may end first; a reclaim costs
    a recompute), and while their readers have under a second left, less than a
    recompute, the margin and RECLAIM_SLACK_S."""
    runs, others = borrowed_cache(waited=waited, unread=unread)
    assert runs == takes_back
    assert len(others) == (2 if takes_back else 3)


def test_a_reclaim_never_takes_a_tenant_below_its_guarantee():
    """Free holds 1,353 against a guarantee of 300: of its lenders' KV, at most the 1,053
    beyond its guarantee is given back; a tenant within its guarantee gives nothing."""
    table = RequestTable()
    rows = []
    for i, (tenant, weight) in enumerate([("free", 1.0)] * 3 + [("ent", 4.0)]):
        row = add(table, f"r{i}", tenant, weight, 450)
        table.admit(row)
        rows.append(row)
    committed = table.running.copy()
    guarantee = np.array([300.0, 1_200.0])  # per tenant id: free, ent
    lenders = committed.copy()
    assert plans.reclaimable(table, committed, lenders, table.demand, guarantee) == 1_053.0
    lenders[rows[:2]] = False  # one free reply of 451 can give back
    assert plans.reclaimable(table, committed, lenders, table.demand, guarantee) == 451.0


def test_a_reply_that_lost_its_kv_has_given_it_back_already():
    """Free's three replies are committed (1,353) but one has lost its KV: free holds 902
    of the cache, 602 beyond its guarantee of 300, and gives back no more than that.
    Counted as held, the lost reply let the same tenant be taken back again and again
    while the cache stayed over-committed (at twice FCFS's capacity, voice replies were
    recomputed up to 39 times each and one reply in eight froze)."""
    table = RequestTable()
    rows = [add(table, f"free{i}", "free", 1.0, 450) for i in range(3)]
    for row in rows:
        table.admit(row)
    committed = table.running.copy()
    table.preempt(rows[2], now=0.0)  # committed still: it comes back when due
    guarantee = np.array([300.0])
    lenders = committed & (table.col("computed") > 0)
    assert plans.reclaimable(table, committed, lenders, table.demand, guarantee) == 602.0


# One slot at 50 tokens/s (SMALL at B=1, plenty of cache): ten readers at 5 tokens/s.
ONE_SLOT = LatencyProfile(
    name="one-slot",
    source="test",
    batch_sizes=(1,),
    decode_s_at=(0.02,),
    kv_capacity_tokens=20_000,
    max_batch=1,
    prefill_per_token_s=2e-4,
    prefill_base_s=0.005,
)


def steady_beside_a_flood() -> list[SimRequest]:
    """Weights 1 : 4. The weight-4 tenant sends a 150-token reply every 5 s (six readers
    at a time, within its guarantee of 4/5 of the rate: eight); the weight-1 tenant one
    every half second from the start, ten times what the slot can pace."""

    def request(tenant: str, weight: float, i: int, every: float) -> SimRequest:
        return SimRequest(
            id=f"{tenant}{i}",
            arrival=every * i,
            prompt_tokens=20,
            output_tokens=150,
            ttft=1.0,
            tds=5.0,
            tenant=tenant,
            weight=weight,
        )

    basic = [request("basic", 1.0, i, 0.5) for i in range(20, 140)]
    return basic + [request("premium", 4.0, i, 6.0) for i in range(12)]


def test_a_tenant_borrowing_beyond_its_guarantee_leaves_a_steady_tenant_its_room():
    """On a slot-bound engine the readers' rate runs short, not the cache. The flooding
    weight-1 tenant borrows what the weight-4 one does not use, but not the room its
    recent requests need: the weight-4 tenant is served at its pace (its first request
    may wait for a reply to end), the flood waits before its first tokens, and nobody
    freezes. With weights ignored, the weight-4 tenant queues behind the flood."""
    workload = steady_beside_a_flood()
    result = simulate(
        workload, tokenpace_andes(ONE_SLOT, fair_share_slack=500.0), ONE_SLOT, pause=True
    )
    blind = simulate(
        workload, tokenpace_andes(ONE_SLOT, fair_share_slack=None), ONE_SLOT, pause=True
    )

    def qoe(run: SimResult, tenant: str) -> float:
        rows = [r for r in run.requests if r.tenant == tenant and r.id != "premium0"]
        return float(np.mean([r.andes_qoe for r in rows]))

    assert qoe(result, "premium") >= 0.95 > qoe(blind, "premium")
    assert qoe(result, "basic") < qoe(result, "premium")
    assert all(r.freezes.longest_s < 0.5 for r in result.requests + blind.requests)
