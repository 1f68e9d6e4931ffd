"""Andes (qos/policy/andes.py) on hand-built tables and small engine loops: selective
triggering, the batch-size range (§4.2), QoE-driven preemption and its cap, the
objectives and solvers, the stall charge, the packing order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qos.latency import LatencyProfile
from qos.policy.andes import Andes, tokenpace_andes
from qos.policy.base import Policy
from qos.policy.exact import exact_k_knapsack
from qos.policy.fcfs import FCFS
from qos.policy.table import Capacity, RequestTable
from tests.support.policy import FAST, LINEAR, MiniEngine, add, assert_valid_mask, random_table


# -- Andes: selective triggering ----------------------------------------------------------
def small_table(n: int, prompt: int = 9, tds: float = 5.0) -> RequestTable:
    table = RequestTable()
    for i in range(n):
        add(table, f"r{i}", arrival=float(i) * 0.1, prompt=prompt, tds=tds)
    return table


def test_andes_everyone_runs_when_all_fit_under_watermark_and_decode_is_fast():
    andes = Andes(FAST)
    table = small_table(5)  # demand 5 × 10 = 50
    capacity = Capacity(kv_tokens=1000, max_batch=8)
    assert not andes.triggered(table, capacity)
    mask = andes.schedule(table, capacity, now=1.0)
    assert mask.all() and mask.shape == (5,)
    assert andes.solves == 0


def test_andes_watermark_boundary():
    andes = Andes(FAST, kv_watermark=0.9)
    table = small_table(9)  # demand 90
    assert not andes.triggered(table, Capacity(kv_tokens=100, max_batch=64))  # 90 <= 90
    add(table, "one-more", arrival=1.0, prompt=0)  # demand 91 > 90: over the watermark
    assert andes.triggered(table, Capacity(kv_tokens=100, max_batch=64))
    andes.schedule(table, Capacity(kv_tokens=100, max_batch=64), now=2.0)
    assert andes.solves == 1


def test_andes_triggers_when_batch_limit_is_exceeded():
    andes = Andes(FAST)
    assert andes.triggered(small_table(5), Capacity(kv_tokens=10_000, max_batch=4))


def test_andes_triggers_when_decode_at_full_batch_is_slower_than_most_stringent_tds():
    # LINEAR: decode_s(20) = 0.029 s -> 34.5 tokens/s for every request at B = 20.
    capacity = Capacity(kv_tokens=100_000, max_batch=256)
    relaxed = small_table(20, tds=30.0)
    assert not Andes(LINEAR).triggered(relaxed, capacity)
    stringent = small_table(19, tds=30.0)
    add(stringent, "voice", arrival=5.0, tds=40.0)  # 40 > 34.5 tokens/s: too slow for it
    andes = Andes(LINEAR)
    assert andes.triggered(stringent, capacity)
    mask = andes.schedule(stringent, capacity, now=6.0)
    assert andes.solves == 1
    assert_valid_mask(mask, stringent, capacity)
    # The solver looks at batches from B_min (fast enough for TDS 40) upward.
    b_min, b_max = andes.batch_range(stringent, capacity)
    assert b_min == LINEAR.max_batch_for_speed(40.0) == 16 and b_max == 20


def test_a_tds_no_batch_size_meets_neither_triggers_nor_sets_b_min():
    """LINEAR decodes 100 tokens/s at B = 1: a request asking for 100 or more is served
    late at every batch size, so it is no reason to solve, nor to shrink the batch
    (it made every light-load iteration a solve that cost QoE and throughput)."""
    capacity = Capacity(kv_tokens=100_000, max_batch=256)
    table = small_table(19, tds=30.0)
    add(table, "fast", arrival=5.0, tds=100.0)
    andes = Andes(LINEAR)
    assert andes.most_stringent_tds(table) == 30.0
    assert not andes.triggered(table, capacity)
    assert andes.schedule(table, capacity, now=6.0).all() and andes.solves == 0
    assert andes.batch_range(table, capacity)[0] == 20  # B_min from TDS 30: all 20 fit
    only_fast = small_table(3, tds=120.0)
    assert andes.most_stringent_tds(only_fast) is None
    assert not andes.triggered(only_fast, capacity)
    assert andes.batch_range(only_fast, Capacity(kv_tokens=25, max_batch=256)) == (2, 2)


# -- Andes: batch range (§4.2 optimisation #2) -------------------------------------------
def reference_b_max(demand: np.ndarray, capacity: Capacity) -> int:
    cum = np.cumsum(np.sort(demand))
    return max(min(int((cum <= capacity.kv_tokens).sum()), capacity.max_batch, demand.size), 1)


def test_andes_batch_range_follows_section_4_2():
    rng = np.random.default_rng(0)
    table = RequestTable()
    for i in range(60):
        add(table, f"r{i}", arrival=0.0, prompt=int(rng.integers(5, 50)), tds=20.0)
    andes = Andes(LINEAR)
    # decode_s(B) = 0.01 + 0.001 (B - 1) <= 1/20 s  <=>  B <= 41
    assert LINEAR.max_batch_for_speed(20.0) == 41
    for kv, max_batch in ((100_000, 256), (100_000, 45), (1500, 256), (600, 256), (5, 256)):
        capacity = Capacity(kv_tokens=kv, max_batch=max_batch)
        b_min, b_max = andes.batch_range(table, capacity)
        assert b_max == reference_b_max(table.demand, capacity), (kv, max_batch)
        assert b_min == min(41, b_max), (kv, max_batch)
        assert 1 <= b_min <= b_max


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), kv=st.integers(1, 400), max_batch=st.integers(1, 14))
def test_andes_batch_range_random(seed, kv, max_batch):
    table = random_table(seed)
    capacity = Capacity(kv, max_batch)
    b_min, b_max = Andes(LINEAR).batch_range(table, capacity)
    assert b_max == reference_b_max(table.demand, capacity)
    assert b_min == min(LINEAR.max_batch_for_speed(float(table.col("tds").max())), b_max)


# -- Andes: QoE-driven preemption --------------------------------------------------------
def displacement_scenario(policy: Policy) -> tuple[RequestTable, Capacity, float]:
    """'old' has delivered 300 tokens in its first 2 s (a minute of reading at 5 tokens/s);
    'new' arrived 1 s ago and is about to miss its 1 s TTFT; the cache fits only one."""
    table = RequestTable()
    old = add(
        table,
        "old",
        arrival=0.0,
        prompt=100,
        tokens_at=list(np.linspace(0.5, 2.0, 300)),
        running=True,
    )
    new = add(table, "new", arrival=9.0, prompt=100)
    for r in (old, new):
        policy.on_arrival(table, r, float(table.col("arrival")[r]))
    capacity = Capacity(kv_tokens=450, max_batch=8)  # demands 401 + 101 > 450
    return table, capacity, 10.0


@pytest.mark.parametrize("qoe", ["andes", "monotone"])
def test_andes_waiting_request_about_to_miss_ttft_displaces_request_with_big_buffer(qoe):
    andes = Andes(FAST, qoe=qoe, horizon_s=10.0)
    table, capacity, now = displacement_scenario(andes)
    forecast = andes.forecast(table, now)
    gain = andes.gains(forecast, now, float(FAST.decode_s(1)))
    old, new = table.row("old"), table.row("new")
    assert forecast.q_wait[old] == pytest.approx(1.0)  # its buffer outlasts the horizon
    assert gain[old] == pytest.approx(0.0, abs=1e-9)
    assert gain[new] > 0.25  # monotone: Q_wait is 1/2 when nothing arrives
    mask = andes.schedule(table, capacity, now)
    assert mask[new] and not mask[old]
    assert andes.preemptions == 1
    # FCFS keeps the old request and leaves the new one waiting.
    fcfs_mask = FCFS().schedule(table, capacity, now)
    assert fcfs_mask[old] and not fcfs_mask[new]


@pytest.mark.parametrize("arrived_ago, claim", [(1.0, True), (0.2, False)])
def test_wait_for_room_preempts_only_for_a_request_the_wait_would_hurt(arrived_ago, claim):
    """'old' is a minute ahead of its reader and a running request finishes every 0.1 s.
    'new' about to miss its 1 s TTFT has a claim: waiting 0.1 s for room hurts it, and it
    displaces 'old'. With 0.8 s of slack it loses nothing by that wait: the paper's Andes
    (Q_wait over the whole horizon) preempts for it all the same; ``wait_for_room`` keeps
    'old' running and leaves 'new' for the room the next completion frees."""
    for wait_for_room in (False, True):
        andes = Andes(FAST, horizon_s=10.0, wait_for_room=wait_for_room)
        table = RequestTable()
        tokens = list(np.linspace(0.5, 2.0, 300))
        old = add(table, "old", prompt=100, tokens_at=tokens, running=True)
        new = add(table, "new", arrival=10.0 - arrived_ago, prompt=100)
        for r in (old, new):
            andes.on_arrival(table, r, float(table.col("arrival")[r]))
        for k in range(10):
            andes.on_finish(table, old, 9.0 + 0.1 * k)
        assert andes.room_wait_s(10.0) == pytest.approx(0.1)
        mask = andes.schedule(table, Capacity(kv_tokens=450, max_batch=8), 10.0)
        displaced = bool(mask[new] and not mask[old])
        assert displaced == (claim or not wait_for_room)
        assert andes.preemptions == int(displaced)
        assert andes.deferred == int(wait_for_room and not claim)


@pytest.mark.parametrize("arrived_ago, claim", [(1.0, True), (0.2, False)])
def test_weights_give_no_claim_of_their_own(arrived_ago, claim):
    """The scenario above across tenants: 'old' belongs to a weight-1 tenant far ahead of
    its share (a level above), 'new' to a weight-4 tenant. The levels order the
    admissions, but 'new' displaces 'old' only if the wait for room would hurt it."""
    andes = Andes(FAST, horizon_s=10.0, wait_for_room=True, fair_share_slack=10.0)
    table = RequestTable()
    tokens = list(np.linspace(0.5, 2.0, 300))
    for k in range(10):  # a request of the weight-1 tenant finishes every 0.1 s
        done = add(table, f"done{k}", tenant="free")
        andes.on_arrival(table, done, 0.0)
        andes.on_finish(table, done, 9.0 + 0.1 * k)
        table.remove(f"done{k}")
    old = add(table, "old", prompt=100, running=True, tenant="free")
    new = add(table, "new", arrival=10.0 - arrived_ago, prompt=100, tenant="ent", weight=4.0)
    for r in (old, new):
        andes.on_arrival(table, r, float(table.col("arrival")[r]))
    for t in tokens:  # the weight-1 tenant's service runs ahead while both are active
        table.record_tokens(old, t)
    mask = andes.schedule(table, Capacity(kv_tokens=450, max_batch=8), 10.0)
    assert andes._levels is not None and andes._levels[old] > andes._levels[new]
    assert bool(mask[new] and not mask[old]) == claim
    assert andes.preemptions == int(claim)


def test_andes_preemption_cap_zero_never_preempts_in_the_scenario():
    andes = Andes(FAST, horizon_s=10.0, preemption_cap=0.0)
    table, capacity, now = displacement_scenario(andes)
    mask = andes.schedule(table, capacity, now)
    assert mask[table.row("old")] and not mask[table.row("new")]
    assert andes.preemptions == 0


@pytest.mark.parametrize("seed", range(4))
def test_andes_preemption_cap_zero_never_preempts_in_an_engine_loop(seed):
    """With P = 0, whenever the running set still fits, the policy keeps all of it."""
    rng = np.random.default_rng(seed)
    andes = Andes(FAST, preemption_cap=0.0, horizon_s=3.0)
    eng = MiniEngine([andes], Capacity(kv_tokens=400, max_batch=6))
    checked = 0
    for i in range(150):
        if rng.random() < 0.4:
            eng.arrive(
                f"q{i}",
                output=int(rng.integers(1, 25)),
                prompt=int(rng.integers(5, 60)),
                ttft=float(rng.uniform(0.2, 2.0)),
                tds=float(rng.uniform(3.0, 15.0)),
            )
        table = eng.table
        if table.n == 0:
            eng.now += eng.dt
            continue
        running = table.running.copy()
        fits = int(table.demand[running].sum()) <= eng.capacity.kv_tokens
        mask = eng.step()[0]
        if fits:
            checked += 1
            assert mask[running].all()
    assert checked > 50
    assert andes.solves > 0  # the solver did run, under contention
    assert eng.preempted_by_policy == 0


# -- Andes: objectives, solvers, validity ------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    kv=st.integers(1, 400),
    max_batch=st.integers(1, 14),
    objective=st.sampled_from(["average", "max-min", "perfect"]),
    qoe=st.sampled_from(["andes", "monotone"]),
    cap=st.sampled_from([0.0, 1.0, 100.0]),
    block_size=st.sampled_from([1, 1, 4, 16]),
)
def test_andes_mask_always_fits_capacity(seed, kv, max_batch, objective, qoe, cap, block_size):
    table = random_table(seed)
    andes = Andes(LINEAR, objective=objective, qoe=qoe, preemption_cap=cap)
    andes.arrivals = table.n
    capacity = Capacity(kv, max_batch, block_size=block_size)
    demand = capacity.demand(table)
    assert (demand >= table.demand).all() and (demand % block_size == 0).all()
    running_fits = int(demand[table.running].sum()) <= kv and (
        int(table.running.sum()) <= max_batch
    )
    mask = andes.schedule(table, capacity, now=20.0)
    if andes.triggered(table, capacity):
        assert_valid_mask(mask, table, capacity)
    else:
        assert mask.all()
        assert int(demand.sum()) <= kv and table.n <= max_batch
    if cap == 0.0 and running_fits:
        assert mask[table.running].all()


@pytest.mark.parametrize("objective", ["average", "max-min", "perfect"])
@pytest.mark.parametrize("qoe", ["andes", "monotone"])
def test_andes_objectives_run_in_an_engine_loop(objective, qoe):
    rng = np.random.default_rng(7)
    andes = Andes(FAST, objective=objective, qoe=qoe)
    eng = MiniEngine([andes], Capacity(kv_tokens=300, max_batch=5))
    for i in range(120):
        if rng.random() < 0.5:
            eng.arrive(
                f"q{i}",
                output=int(rng.integers(1, 20)),
                prompt=int(rng.integers(5, 60)),
                tds=float(rng.uniform(3.0, 15.0)),
            )
        if eng.table.n:
            eng.step()  # asserts the mask is valid
        else:
            eng.now += eng.dt
    assert andes.solves > 0


def test_andes_gains_by_objective_on_the_scenario():
    andes = Andes(FAST, horizon_s=10.0)
    table, _, now = displacement_scenario(andes)
    forecast = andes.forecast(table, now)
    old, new = table.row("old"), table.row("new")
    tau = float(FAST.decode_s(1))
    max_min = Andes(FAST, objective="max-min", horizon_s=10.0).gains(forecast, now, tau)
    q_min = float(forecast.q_now.min())
    np.testing.assert_allclose(max_min, np.maximum(q_min - forecast.q_wait, 0.0))
    perfect = Andes(FAST, objective="perfect", horizon_s=10.0).gains(forecast, now, tau)
    assert set(np.unique(perfect).tolist()) <= {-1.0, 0.0, 1.0}
    assert perfect[old] == 0.0  # perfect either way
    assert forecast.q_wait[new] < 1.0


def test_andes_with_exact_solver_gives_valid_masks():
    for seed in range(20):
        table = random_table(seed, n_max=9)
        capacity = Capacity(kv_tokens=int(table.demand.sum() * 0.6) + 1, max_batch=6)
        exact = Andes(LINEAR, solver=exact_k_knapsack)
        exact.arrivals = table.n
        mask = exact.schedule(table, capacity, now=20.0)
        assert_valid_mask(mask, table, capacity)
        assert exact.solves == 1


def test_andes_exact_solver_picks_the_scenario_newcomer_too():
    andes = Andes(FAST, horizon_s=10.0, solver=exact_k_knapsack)
    table, capacity, now = displacement_scenario(andes)
    mask = andes.schedule(table, capacity, now)
    assert mask[table.row("new")] and not mask[table.row("old")]


def test_andes_empty_table_and_horizon():
    andes = Andes(FAST, initial_horizon_s=8.0)
    assert andes.schedule(RequestTable(), Capacity(10, 2), 0.0).shape == (0,)
    assert andes.horizon_s == pytest.approx(8.0)
    table = RequestTable()
    add(table, "x", arrival=1.0)
    andes.on_finish(table, 0, now=5.0)  # took 4 s
    assert andes.horizon_s == pytest.approx(6.0)
    assert Andes(FAST, horizon_s=3.0).horizon_s == 3.0


# -- the stall charge (tokenpace extension, off by default) -----------------------------
def stall_scenario(k: float) -> tuple[Andes, RequestTable, np.ndarray]:
    """One running request, one waiting with a 0.5 s prefill; room for only one of them."""
    slow_prefill = LatencyProfile(
        name="slow-prefill",
        source="test",
        batch_sizes=(1, 64),
        decode_s_at=(0.02, 0.04),
        kv_capacity_tokens=100_000,
        max_batch=64,
        prefill_per_token_s=5e-3,
    )
    andes = Andes(slow_prefill, horizon_s=10.0, kv_watermark=1.0, preemption_cost=k)
    table = RequestTable()
    add(
        table,
        "run",
        arrival=8.0,
        prompt=100,
        running=True,
        tokens_at=[9.0 + 0.2 * i for i in range(5)],
    )
    add(table, "wait", arrival=9.0, prompt=100)
    for r in range(table.n):
        andes.on_arrival(table, r, 9.0)
    return andes, table, andes.schedule(table, Capacity(kv_tokens=150, max_batch=8), now=10.0)


def test_stall_charge_is_k_times_prefill_share_of_the_batch_gain():
    andes, table, _ = stall_scenario(4.0)
    forecast = andes.forecast(table, 10.0)
    gain = andes.gains(forecast, 10.0, 0.02)
    charge = andes.stall_charge(forecast, gain, table.running)
    run, wait = table.row("run"), table.row("wait")
    assert charge[run] == 0.0  # running: no prefill before its next token
    assert charge[wait] == pytest.approx(4.0 * gain[run] * 0.5 / 10.0)  # k·G·p/Δt


def test_stall_charge_keeps_a_running_request_the_paper_would_preempt():
    _, _, paper = stall_scenario(0.0)
    np.testing.assert_array_equal(paper, [False, True])  # Eq. 5 alone swaps them
    _, _, charged = stall_scenario(4.0)
    np.testing.assert_array_equal(charged, [True, False])  # 0.5 s of stall is not worth it


def test_preemption_cost_must_not_be_negative():
    with pytest.raises(ValueError, match="preemption_cost"):
        Andes(FAST, preemption_cost=-1.0)


def test_packing_order_keeps_running_requests_first_on_ties():
    """Zero gain everywhere must not preempt running requests in favour of lower rows."""
    table = RequestTable()
    add(table, "wait0", arrival=0.0)
    add(table, "run1", arrival=0.0, running=True)
    add(table, "wait2", arrival=0.0)
    add(table, "run3", arrival=0.0, running=True)
    ties = np.zeros(table.n)
    for policy in (Andes(FAST), tokenpace_andes(FAST)):
        order = [table.keys[r] for r in policy.packing_order(table, ties)]
        assert order == ["run1", "run3", "wait0", "wait2"]
    ranked = np.array([0.0, 0.0, 1.0, 0.0])  # priority still comes first
    assert table.keys[int(Andes(FAST).packing_order(table, ranked)[0])] == "wait2"
