"""Tenant weights inside Andes (qos/policy/fair.py): identical to unweighted Andes for one
tenant or equal weights, the levels, and weighted fair share in the simulator (two
backlogged tenants, weights 1 : 2, against VTC's)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qos.fairness import W_OUTPUT, W_PROMPT
from qos.latency import LatencyProfile
from qos.policy.andes import UNGUARDED, Andes, tokenpace_andes
from qos.policy.base import Policy
from qos.policy.table import Capacity, RequestTable
from qos.policy.vtc import VTC
from tests.support.policy import FAST, MiniEngine, add


# -- tenant weights inside Andes (qos/policy/fair.py) -----------------------------------
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), tenants=st.integers(1, 4))
def test_equal_weights_decide_exactly_as_unweighted_andes(seed, tenants):
    """One tenant, or several of one weight: the weighted policy's masks are the
    unweighted one's, step by step, whatever the counters say."""
    rng = np.random.default_rng(seed)
    weight = float(rng.choice([0.5, 1.0, 3.0]))
    unweighted = tokenpace_andes(FAST, fair_share_slack=None)
    weighted = tokenpace_andes(FAST, fair_share_slack=float(rng.choice([0.0, 50.0, 4096.0])))
    eng = MiniEngine(
        [unweighted, weighted], Capacity(kv_tokens=int(rng.integers(150, 500)), max_batch=6)
    )
    steps = 0
    for i in range(120):
        if rng.random() < 0.5:
            eng.arrive(
                f"q{i}",
                output=int(rng.integers(1, 30)),
                prompt=int(rng.integers(1, 80)),
                ttft=float(rng.uniform(0.2, 2.0)),
                tds=float(rng.uniform(3.0, 60.0)),  # some above the batch-1 speed (50)
                tenant=f"t{int(rng.integers(tenants))}",
                weight=weight,
            )
        if eng.table.n == 0:
            eng.now += eng.dt
            continue
        mask_plain, mask_weighted = eng.step()
        np.testing.assert_array_equal(mask_plain, mask_weighted)
        steps += 1
    assert steps > 50
    assert unweighted.solves == weighted.solves > 0
    assert unweighted.preemptions == weighted.preemptions
    assert sum(weighted.shares.vtc.counters.values()) > 0


def weighted_andes(**kw) -> Andes:
    return Andes(FAST, horizon_s=10.0, **{"fair_share_slack": 50.0, **kw})


def test_tenant_counters_are_settled_plus_live_service():
    policy = weighted_andes()
    table = RequestTable()
    add(table, "a0", prompt=10, tenant="a", weight=2.0, running=True, tokens_at=[0.1, 0.2])
    add(table, "b0", prompt=30, tenant="b", weight=1.0)  # waiting: no service yet
    for r in range(table.n):
        policy.on_arrival(table, r, 0.0)
    a = (W_PROMPT * 10 + W_OUTPUT * 2) / 2.0
    counters = dict(zip(table.keys, policy.shares.counters(table).tolist(), strict=True))
    assert counters == {"a0": a, "b0": a}  # b lifted to the active a's counter on arrival
    table.record_tokens(table.row("a0"), 0.3)
    assert policy.shares.counters(table)[table.row("a0")] == a + W_OUTPUT / 2.0
    policy.on_finish(table, table.row("a0"), 1.0)
    table.remove("a0")
    assert policy.shares.vtc.counter("a") == a + W_OUTPUT / 2.0
    assert policy.shares.vtc.queued["a"] == 0


def test_counter_lift_reads_the_live_service_of_active_tenants():
    """A tenant returning from idle is lifted to the least active counter, live service
    included (VTC's lift, as if every token had been charged as it came)."""
    policy = weighted_andes()
    table = RequestTable()
    add(table, "a0", prompt=0, tenant="a", running=True, tokens_at=[0.1 * i for i in range(50)])
    policy.on_arrival(table, 0, 0.0)
    r = add(table, "b0", prompt=0, tenant="b")
    policy.on_arrival(table, r, 5.0)
    assert policy.shares.vtc.counter("b") == W_OUTPUT * 50


def test_levels_pack_the_tenant_ahead_after_the_one_behind():
    policy = weighted_andes()
    table = RequestTable()
    for i in range(3):
        add(table, f"a{i}", arrival=9.0, prompt=9, tenant="a", weight=1.0)  # Andes's pick
        add(table, f"b{i}", arrival=5.0, prompt=9, tenant="b", weight=2.0)
    for r in range(table.n):
        policy.on_arrival(table, r, 0.0)
    capacity = Capacity(kv_tokens=34, max_batch=8)  # three of six (packing to 90 %)
    plain = Andes(FAST, horizon_s=10.0).schedule(table, capacity, now=10.0)
    assert sorted(table.keys[r] for r in np.flatnonzero(plain)) == ["a0", "a1", "a2"]
    policy.shares.vtc.charge("a", 1.0, output_tokens=20)  # a: 40, within b + 50
    assert policy.shares.levels(table, ~table.running) is None
    np.testing.assert_array_equal(policy.schedule(table, capacity, 10.0), plain)
    policy.shares.vtc.charge("a", 1.0, output_tokens=10)  # a: 60 > 0 + 50: b goes first
    np.testing.assert_array_equal(
        policy.shares.levels(table, ~table.running), [k[0] == "a" for k in table.keys]
    )
    mask = policy.schedule(table, capacity, 10.0)
    assert sorted(table.keys[r] for r in np.flatnonzero(mask)) == ["b0", "b1", "b2"]


def test_a_tenant_with_nothing_waiting_sets_no_level():
    """Weighted max-min: a tenant served all it asks for is no reference for the others."""
    policy = weighted_andes()
    table = RequestTable()
    add(table, "a0", tenant="a", weight=4.0, running=True, tokens_at=[0.1])
    add(table, "b0", tenant="b", weight=1.0)
    add(table, "c0", tenant="c", weight=2.0)
    for r in range(table.n):
        policy.on_arrival(table, r, 0.0)
    policy.shares.vtc.charge("b", 1.0, output_tokens=100)  # b: 200, c: 0, a: live 11/4
    levels = dict(
        zip(table.keys, policy.shares.levels(table, ~table.running).tolist(), strict=True)
    )
    assert levels == {"a0": 0.0, "b0": 4.0, "c0": 0.0}  # b: ⌊(200 − 0) / 50⌋


def test_a_waiting_request_that_does_not_fit_holds_the_room_against_higher_levels():
    """Without the rule, short requests of the tenant ahead fill every gap and the long
    ones of the tenant behind never fit (seen: 1.2-1.5x the fair share)."""
    policy = weighted_andes(kv_watermark=1.0, preemption_cap=0.0)
    table = RequestTable()
    add(table, "a-run", arrival=0.0, prompt=60, tenant="a", weight=1.0, running=True)  # 61
    add(table, "b-long", arrival=9.0, prompt=50, tenant="b", weight=2.0)  # 51: does not fit
    add(table, "a-short", arrival=9.0, prompt=9, tenant="a", weight=1.0)  # 10: would fit
    for r in range(table.n):
        policy.on_arrival(table, r, 0.0)
    policy.shares.vtc.charge("a", 1.0, prompt_tokens=500)  # a far ahead
    mask = policy.schedule(table, Capacity(kv_tokens=80, max_batch=8), now=10.0)
    np.testing.assert_array_equal(mask, [True, False, False])  # P = 0: a-run keeps its place
    plain = weighted_andes(kv_watermark=1.0, preemption_cap=0.0, fair_share_slack=None)
    for r in range(table.n):
        plain.on_arrival(table, r, 0.0)
    assert plain.schedule(table, Capacity(kv_tokens=80, max_batch=8), now=10.0)[2]


def test_weighted_admissions_follow_the_levels_when_preemption_cap_binds():
    policy = weighted_andes(kv_watermark=1.0, preemption_cap=0.0)
    table = RequestTable()
    add(table, "a-run", arrival=0.0, prompt=80, tenant="a", weight=1.0, running=True)  # 81
    add(table, "a-wait", arrival=9.5, prompt=9, tenant="a", weight=1.0)  # 10
    add(table, "b-wait", arrival=9.5, prompt=9, tenant="b", weight=2.0)  # 10
    for r in range(table.n):
        policy.on_arrival(table, r, float(table.col("arrival")[r]))
    policy.shares.vtc.charge("a", 1.0, prompt_tokens=500)
    mask = policy.schedule(table, Capacity(kv_tokens=95, max_batch=8), now=10.0)
    assert mask[table.row("a-run")] and mask[table.row("b-wait")]
    assert not mask[table.row("a-wait")]


def test_andes_admissions_follow_priority_when_preemption_cap_binds():
    """Regression (same root cause): with the budget spent, the space left next to the kept
    running request goes to the lowest row among the solver's admissions, not to the
    highest-priority one."""
    andes = Andes(FAST, horizon_s=10.0, preemption_cap=0.0, kv_watermark=1.0)
    table = RequestTable()
    add(table, "run", arrival=0.0, prompt=100, running=True)  # demand 101, low priority
    add(table, "wide", arrival=9.5, prompt=40)  # demand 41: lower gain per KV slot
    add(table, "narrow", arrival=9.5, prompt=10)  # demand 11: highest priority
    for r in range(table.n):
        andes.on_arrival(table, r, float(table.col("arrival")[r]))
    capacity = Capacity(kv_tokens=145, max_batch=8)  # run + either, not both
    forecast = andes.forecast(table, 10.0)
    priority = andes.gains(forecast, 10.0, float(FAST.decode_s(2))) / table.demand
    assert priority[table.row("narrow")] > priority[table.row("wide")]
    mask = andes.schedule(table, capacity, now=10.0)
    assert mask[table.row("run")]
    assert mask[table.row("narrow")] and not mask[table.row("wide")]


# -- weighted vs unweighted Andes in the simulator: two backlogged tenants, weights 1 : 2 --
def two_tenant_workload(seed: int = 0, n: int = 200):
    from qos.sim.workload import SimRequest

    rng = np.random.default_rng(seed)
    reqs = []
    for tenant, weight in (("a", 1.0), ("b", 2.0)):
        for i in range(n):
            reqs.append(
                SimRequest(
                    id=f"{tenant}{i}",
                    arrival=0.0,
                    prompt_tokens=int(rng.integers(20, 200)),
                    output_tokens=int(rng.integers(20, 120)),
                    ttft=1.0,
                    tds=5.0,
                    tenant=tenant,
                    weight=weight,
                )
            )
    return reqs


BACKLOG_PROFILE = LatencyProfile(
    name="backlog",
    source="test",
    batch_sizes=(1, 16, 32),
    decode_s_at=(0.02, 0.03, 0.05),
    kv_capacity_tokens=3000,  # ~25 requests: both tenants stay backlogged
    max_batch=32,
    prefill_per_token_s=1e-5,
)


def tenant_counters(policy: Policy, table: RequestTable) -> dict[str, float]:
    """Each tenant's weighted counter: VTC's own, or weighted Andes's (settled plus live)."""
    if isinstance(policy, VTC):
        return dict(policy.vtc.counters)
    shares = getattr(policy, "shares", None)
    if shares is None:
        return {}
    by_row = shares.counters(table)
    ids = table.col("tenant")
    out = {t: shares.vtc.counter(t) for t in table.tenant_names}
    out.update({table.tenant_names[i]: float(by_row[ids == i][0]) for i in np.unique(ids)})
    return out


def run_backlogged(policy: Policy, seed: int = 0, max_iters: int = 3000) -> dict:
    """Step the simulator's engine while both tenants have waiting requests.

    Service is measured from what the engine emitted (w_p·prompt at a request's first
    token, w_q per token), independently of the policy's own counters.
    """
    from qos.sim.engine import Engine

    reqs = two_tenant_workload(seed)
    prompts = {r.id: r.prompt_tokens for r in reqs}
    engine = Engine(policy, BACKLOG_PROFILE, block_size=1)
    for r in reqs:
        engine.submit(r)
    service = {"a": 0.0, "b": 0.0}
    held = {"a": 0.0, "b": 0.0}  # KV the tenant's started replies hold, summed over steps
    max_gap = 0.0
    max_batch = 0
    now = 0.0
    iters = 0
    for _ in range(max_iters):
        table = engine.table
        waiting_tenants = set(table.col("tenant")[~table.running].tolist())
        if iters and len(waiting_tenants) < 2:
            break  # one tenant's backlog ran out
        res = engine.step(now)
        assert res.batch_size > 0
        iters += 1
        max_batch = max(max_batch, res.batch_size)
        for rid, index, _ in res.emitted:
            service[rid[0]] += W_OUTPUT + (W_PROMPT * prompts[rid] if index == 0 else 0.0)
        table = engine.table
        committed = table.running | (table.col("output") > 0)
        for name in held:
            mine = committed & (table.col("tenant") == table.tenant_id(name))
            held[name] += float(table.demand[mine].sum())
        counters = tenant_counters(policy, engine.table)
        if counters:
            max_gap = max(max_gap, abs(counters["a"] - counters["b"]))
        now = res.end
    return {
        "counters": tenant_counters(policy, engine.table),
        "service": service,
        "ratio": service["b"] / service["a"],
        "held_ratio": held["b"] / held["a"],
        "max_gap": max_gap,
        "b_max": max_batch,
        "l_input": max(prompts.values()),
        "iters": iters,
        "preemptions": engine.total_preemptions,
    }


@pytest.fixture(scope="module")
def fair_run():
    """The solver's VTC levels (qos/policy/fair.py), without the reader guard: what
    orders due replies when service itself is the bottleneck, and what
    andes-tp-unguarded packs by."""
    return run_backlogged(
        tokenpace_andes(
            BACKLOG_PROFILE,
            **{**UNGUARDED, "fair_share_slack": 500.0, "preemption_cap": 100.0},
        )
    )


def test_weighted_andes_service_ratio_is_close_to_one_to_two(fair_run):
    assert fair_run["iters"] > 500
    assert fair_run["ratio"] == pytest.approx(2.0, rel=0.10)


def test_weighted_andes_counters_track_measured_service(fair_run):
    # Both tenants arrive at t = 0 and stay backlogged, so no lift applies after the
    # first enqueue: counter = service / weight, service measured from the emissions.
    assert fair_run["counters"]["a"] == pytest.approx(fair_run["service"]["a"] / 1.0)
    assert fair_run["counters"]["b"] == pytest.approx(fair_run["service"]["b"] / 2.0)


def test_weighted_andes_counters_within_documented_bound(fair_run):
    """qos/policy/fair.py: slack + (w_p·L_input + w_q·M_f)/w_min, M_f at most a full batch
    of the longest replies (120 tokens) here."""
    m_f = fair_run["b_max"] * 120
    bound = 500.0 + (W_PROMPT * fair_run["l_input"] * fair_run["b_max"] + W_OUTPUT * m_f) / 1.0
    assert fair_run["max_gap"] <= bound


def test_shipped_policy_splits_the_admission_room_by_weight():
    """andes-tp: two backlogged tenants of weights 1 and 2 hold the engine's KV about
    1 : 2 (qos/policy/plans.py); service follows, within what the sizes of the requests
    allow (the plans split room, not tokens)."""
    run = run_backlogged(tokenpace_andes(BACKLOG_PROFILE, fair_share_slack=500.0))
    assert run["iters"] > 500
    assert run["held_ratio"] == pytest.approx(2.0, rel=0.10), run
    assert 1.5 < run["ratio"] < 2.5, run


def test_unweighted_andes_ignores_weights():
    """Andes without weights on the same workload splits service about evenly (seen:
    b/a ≈ 0.97), far from the 1:2 the weights ask for."""
    run = run_backlogged(tokenpace_andes(BACKLOG_PROFILE, fair_share_slack=None))
    assert run["iters"] > 500
    assert run["ratio"] < 1.5


def test_vtc_policy_shares_by_weight_in_the_simulator():
    run = run_backlogged(VTC())
    assert run["ratio"] == pytest.approx(2.0, rel=0.10)
    # VTC's own bound (slides): 2·max(w_p·L_input, w_q·M), M the most tokens in a batch.
    assert run["max_gap"] <= 2 * max(W_PROMPT * run["l_input"], W_OUTPUT * 3000)


def test_a_waiting_request_ahead_of_its_reader_does_not_make_its_tenant_backlogged():
    """Tenant b (weight 2) is far behind a in service, and its only waiting request was
    paused well ahead of its reader: waiting does not hurt it, so b is no reference and
    a's fresh request runs as without weights. Behind its reader, the same request asks:
    b is backlogged, a is at a higher level, and a's request waits."""

    def decide(ahead: bool) -> np.ndarray:
        policy = weighted_andes(kv_watermark=1.0, preemption_cap=0.0)
        table = RequestTable()
        add(table, "a-run", arrival=0.0, prompt=40, tenant="a", weight=1.0, running=True)
        start = 9.0 if ahead else -30.0  # 100 tokens read at 5/s take 20 s
        tokens = [start + 0.01 * k for k in range(100)]
        add(
            table,
            "b-paused",
            arrival=start - 1.0,
            prompt=10,
            tenant="b",
            weight=2.0,
            tokens_at=tokens,
        )
        add(table, "a-new", arrival=9.9, prompt=9, tenant="a", weight=1.0)
        for r in range(table.n):
            policy.on_arrival(table, r, 0.0)
        policy.shares.vtc.charge("a", 1.0, prompt_tokens=500)  # a far ahead
        # room for a-run and one of the two waiting requests, not both
        return policy.schedule(table, Capacity(kv_tokens=155, max_batch=8), now=10.0)

    np.testing.assert_array_equal(decide(ahead=True), [True, False, True])
    assert not decide(ahead=False)[2]
