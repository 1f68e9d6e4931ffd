"""Scheduling policies on hand-built request tables and small engine loops.

Covers the packing primitives (pack_in_order, FCFS, the Algorithm 2 DP), the baselines
(FCFS, round robin), Andes (selective triggering, batch-size range, QoE-driven
preemption, preemption cap, objectives, solvers), VTC (counter, counter lift, policy)
and Andes with tenant weights (identity with unweighted Andes for one tenant or equal
weights, the levels, weighted fair share in simulation).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qos.fairness import W_OUTPUT, W_PROMPT, VirtualTokenCounter
from qos.latency import LatencyProfile
from qos.policy.andes import Andes, tokenpace_andes
from qos.policy.base import Policy, pack_in_order
from qos.policy.exact import exact_k_knapsack
from qos.policy.fcfs import FCFS
from qos.policy.round_robin import RoundRobin
from qos.policy.table import Capacity, RequestTable
from qos.policy.vtc import VTC

# A fast engine: 50 tokens/s per request at B=1, 25 at B=64, so a TDS of 5-10 is always met.
FAST = LatencyProfile(
    name="fast",
    source="test",
    batch_sizes=(1, 64),
    decode_s_at=(0.02, 0.04),
    kv_capacity_tokens=100_000,
    max_batch=64,
    prefill_per_token_s=1e-5,
)
# A slow engine: decode_s(B) = 0.01 + 0.001·(B - 1), i.e. 100 tokens/s at B=1, ~9 at B=100.
LINEAR = LatencyProfile(
    name="linear",
    source="test",
    batch_sizes=(1, 100),
    decode_s_at=(0.01, 0.109),
    kv_capacity_tokens=100_000,
    max_batch=256,
    prefill_per_token_s=1e-5,
)


# -- helpers -----------------------------------------------------------------------------
def add(
    table: RequestTable,
    key: str,
    *,
    arrival: float = 0.0,
    prompt: int = 10,
    ttft: float = 1.0,
    tds: float = 5.0,
    tenant: str = "default",
    weight: float = 1.0,
    running: bool = False,
    tokens_at: list[float] | None = None,
) -> int:
    """Add one request; optionally mark it running and deliver tokens at the given times."""
    r = table.add(
        key,
        arrival=arrival,
        prompt_tokens=prompt,
        ttft=ttft,
        tds=tds,
        tenant=tenant,
        weight=weight,
    )
    for t in tokens_at or []:
        table.record_tokens(r, t)
    if running:
        table.admit(r)
    return r


def random_table(seed: int, n_max: int = 12, now: float = 20.0) -> RequestTable:
    """A random table of waiting and running requests, some with tokens delivered."""
    rng = np.random.default_rng(seed)
    table = RequestTable(initial_capacity=4)  # exercises growth too
    for i in range(int(rng.integers(1, n_max + 1))):
        arrival = float(rng.uniform(0.0, now - 0.1))
        r = table.add(
            f"r{i}",
            arrival=arrival,
            prompt_tokens=int(rng.integers(0, 60)),
            ttft=float(rng.uniform(0.1, 3.0)),
            tds=float(rng.uniform(1.0, 20.0)),
            tenant=str(rng.choice(["a", "b", "c"])),
            weight=float(rng.choice([1.0, 2.0])),
        )
        out = int(rng.integers(0, 30))
        for t in np.sort(rng.uniform(arrival, now, size=out)):
            table.record_tokens(r, float(t))
        if rng.random() < 0.5:
            table.admit(r)
    return table


def assert_valid_mask(mask: np.ndarray, table: RequestTable, capacity: Capacity) -> None:
    assert isinstance(mask, np.ndarray)
    assert mask.dtype == bool
    assert mask.shape == (table.n,)
    assert int(capacity.demand(table)[mask].sum()) <= capacity.kv_tokens
    assert int(mask.sum()) <= capacity.max_batch


def apply_mask(table: RequestTable, mask: np.ndarray, now: float) -> None:
    running = table.running.copy()
    for r in np.flatnonzero(running & ~mask):
        table.preempt(int(r), now)
    for r in np.flatnonzero(mask & ~running):
        table.admit(int(r))


class MiniEngine:
    """A few lines that behave like an engine: schedule, admit/preempt, tokens, finish.

    ``policies[0]`` decides; every policy hears every hook, so policies with state can be
    compared on the same sequence of tables.
    """

    def __init__(self, policies: list[Policy], capacity: Capacity, dt: float = 0.05) -> None:
        self.policies = policies
        self.capacity = capacity
        self.dt = dt
        self.table = RequestTable()
        self.targets: dict[str, int] = {}
        self.prefilled: set[str] = set()
        self.now = 0.0
        self.preempted_by_policy = 0

    def arrive(self, key: str, *, output: int, **kwargs) -> None:
        r = add(self.table, key, arrival=self.now, **kwargs)
        self.targets[key] = output
        for p in self.policies:
            p.on_arrival(self.table, r, self.now)

    def step(self) -> list[np.ndarray]:
        table, now = self.table, self.now
        masks = [p.schedule(table, self.capacity, now) for p in self.policies]
        mask = masks[0]
        assert_valid_mask(mask, table, self.capacity)
        self.preempted_by_policy += int((table.running & ~mask).sum())
        apply_mask(table, mask, now)
        end = now + self.dt
        prompt = table.col("prompt")
        for r in np.flatnonzero(mask).tolist():
            key = table.keys[r]
            for p in self.policies:
                if key not in self.prefilled:
                    p.on_prefill(table, r, int(prompt[r]))
                p.on_tokens(table, r, 1)
            self.prefilled.add(key)
            table.record_tokens(r, end)
        output = table.col("output")
        done = [
            table.keys[r] for r in np.flatnonzero(mask) if output[r] >= self.targets[table.keys[r]]
        ]
        for key in done:
            for p in self.policies:
                p.on_finish(table, table.row(key), end)
            table.remove(key)
        self.now = end
        return masks


# -- pack_in_order -----------------------------------------------------------------------
def greedy_loop(order, sizes, kv_tokens, max_batch, n):
    chosen = np.zeros(n, dtype=bool)
    used = count = 0
    for i in order:
        if count >= max_batch:
            break
        if used + sizes[i] <= kv_tokens:
            chosen[i] = True
            used += sizes[i]
            count += 1
    return chosen


@settings(max_examples=400, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=0, max_size=14),
    data=st.data(),
    kv_tokens=st.integers(0, 120),
    max_batch=st.integers(0, 15),
)
def test_pack_in_order_equals_sequential_greedy_with_skip(sizes, data, kv_tokens, max_batch):
    n = len(sizes)
    order = data.draw(st.lists(st.sampled_from(range(n)), unique=True) if n else st.just([]))
    order_arr = np.asarray(order, dtype=np.int64)
    sizes_arr = np.asarray(sizes, dtype=np.int64)
    got = pack_in_order(order_arr, sizes_arr, kv_tokens, max_batch, n)
    want = greedy_loop(order, sizes, kv_tokens, max_batch, n)
    np.testing.assert_array_equal(got, want)
    assert int(sizes_arr[got].sum()) <= kv_tokens
    assert int(got.sum()) <= max_batch
    assert not got[np.setdiff1d(np.arange(n), order_arr)].any()  # only rows in order


def test_pack_in_order_skips_what_does_not_fit_and_respects_limits():
    sizes = np.array([5, 8, 3, 2, 9])
    order = np.array([0, 1, 2, 3, 4])
    # 5 fits, 8 does not (13 > 10): skipped, 3 fits (8), 2 fits (10), 9 skipped.
    np.testing.assert_array_equal(
        pack_in_order(order, sizes, 10, 10, 5), [True, False, True, True, False]
    )
    # batch limit 2: the first two that fit, then stop.
    np.testing.assert_array_equal(
        pack_in_order(order, sizes, 10, 2, 5), [True, False, True, False, False]
    )
    assert not pack_in_order(order, sizes, 1, 10, 5).any()
    assert not pack_in_order(order, sizes, 100, 0, 5).any()
    assert pack_in_order(order, sizes, 100, 10, 5).all()


# -- FCFS -----------------------------------------------------------------------------
def test_fcfs_runs_in_arrival_order_not_row_order():
    table = RequestTable()
    add(table, "late", arrival=3.0, prompt=9)  # demand 10
    add(table, "first", arrival=1.0, prompt=9)
    add(table, "second", arrival=2.0, prompt=9)
    mask = FCFS().schedule(table, Capacity(kv_tokens=20, max_batch=8), now=4.0)
    np.testing.assert_array_equal(mask, [False, True, True])


def test_fcfs_head_of_line_blocking_stops_at_first_that_does_not_fit():
    table = RequestTable()
    add(table, "a", arrival=0.0, prompt=9)  # demand 10
    add(table, "big", arrival=1.0, prompt=99)  # demand 100: does not fit
    add(table, "small", arrival=2.0, prompt=0)  # demand 1: would fit, but FCFS stops
    mask = FCFS().schedule(table, Capacity(kv_tokens=50, max_batch=8), now=3.0)
    np.testing.assert_array_equal(mask, [True, False, False])


def test_fcfs_max_batch():
    table = RequestTable()
    for i in range(5):
        add(table, f"r{i}", arrival=float(i), prompt=1)
    mask = FCFS().schedule(table, Capacity(kv_tokens=1000, max_batch=3), now=9.0)
    np.testing.assert_array_equal(mask, [True, True, True, False, False])
    assert FCFS().schedule(RequestTable(), Capacity(10, 2), now=0.0).shape == (0,)


def test_fcfs_and_vtc_count_whole_kv_blocks():
    table = RequestTable()
    for i in range(3):
        add(table, f"r{i}", arrival=float(i), prompt=9)  # 10 tokens -> one 16-token block
    paged = Capacity(kv_tokens=40, max_batch=8, block_size=16)
    np.testing.assert_array_equal(paged.demand(table), [16, 16, 16])
    np.testing.assert_array_equal(FCFS().schedule(table, paged, 3.0), [True, True, False])
    assert VTC().schedule(table, paged, 3.0).sum() == 2
    assert FCFS().schedule(table, Capacity(kv_tokens=40, max_batch=8), 3.0).all()


# -- round robin ------------------------------------------------------------------------
def rr_run(policy: RoundRobin, table: RequestTable, capacity: Capacity, iters: int):
    """Return which key ran in each iteration (one-slot capacity) and preemption events."""
    ran, preempted, now = [], [], 0.0
    for _ in range(iters):
        now += 0.1
        mask = policy.schedule(table, capacity, now)
        preempted += [table.keys[r] for r in np.flatnonzero(table.running & ~mask)]
        apply_mask(table, mask, now)
        ran.append(tuple(table.keys[r] for r in np.flatnonzero(mask)))
        for r in np.flatnonzero(mask):
            table.record_tokens(int(r), now + 0.05)
    return ran, preempted


def test_round_robin_preempts_after_interval_when_others_wait_and_requeues_at_back():
    table = RequestTable()
    add(table, "A", arrival=0.0, prompt=10)
    add(table, "B", arrival=0.01, prompt=10)
    add(table, "C", arrival=0.02, prompt=10)
    # Room for exactly one request (contexts stay well under 60 here).
    ran, preempted = rr_run(RoundRobin(interval=3), table, Capacity(60, 1), iters=12)
    assert ran == [("A",)] * 3 + [("B",)] * 3 + [("C",)] * 3 + [("A",)] * 3
    assert preempted == ["A", "B", "C"]
    assert table.col("preemptions")[table.row("A")] == 1


def test_round_robin_runs_forever_when_alone():
    table = RequestTable()
    add(table, "A", arrival=0.0, prompt=10)
    ran, preempted = rr_run(RoundRobin(interval=2), table, Capacity(1000, 1), iters=20)
    assert ran == [("A",)] * 20
    assert preempted == []


def test_round_robin_keeps_everyone_when_everyone_fits():
    table = RequestTable()
    add(table, "A", arrival=0.0)
    add(table, "B", arrival=0.1)
    ran, preempted = rr_run(RoundRobin(interval=1), table, Capacity(1000, 4), iters=10)
    assert ran == [("A", "B")] * 10
    assert preempted == []


def test_round_robin_forgets_finished_requests():
    policy = RoundRobin(interval=2)
    table = RequestTable()
    add(table, "A")
    apply_mask(table, policy.schedule(table, Capacity(100, 1), 0.0), 0.0)
    policy.on_finish(table, 0, 1.0)
    table.remove("A")
    add(table, "A", arrival=1.0)  # same key, new request: a fresh slot
    add(table, "B", arrival=1.0)
    ran, _ = rr_run(policy, table, Capacity(100, 1), iters=2)
    assert ran == [("A",), ("A",)]


# -- exact k-item knapsack (Algorithm 2) -------------------------------------------------
def brute_force(values, sizes, capacity, k):
    """Best value over subsets of exactly min(k, n) items, or of the largest feasible count."""
    n = len(values)
    for kk in range(min(k, n), -1, -1):
        best = None
        for subset in itertools.combinations(range(n), kk):
            if sum(sizes[i] for i in subset) <= capacity:
                v = sum(values[i] for i in subset)
                best = v if best is None else max(best, v)
        if best is not None:
            return kk, best
    raise AssertionError("the empty set always fits")


knapsack_instances = st.integers(0, 8).flatmap(
    lambda n: st.tuples(
        st.lists(st.floats(-10, 10, allow_nan=False), min_size=n, max_size=n),
        st.lists(st.integers(0, 15), min_size=n, max_size=n),
        st.integers(0, 30),
        st.integers(0, n + 2),
    )
)


@settings(max_examples=300, deadline=None)
@given(knapsack_instances)
def test_exact_k_knapsack_equals_brute_force(instance):
    values, sizes, capacity, k = instance
    chosen = exact_k_knapsack(np.array(values, dtype=float), np.array(sizes), capacity, k)
    assert chosen.dtype == bool and chosen.shape == (len(values),)
    kk, best = brute_force(values, sizes, capacity, k)
    assert int(chosen.sum()) == kk
    assert sum(s for s, c in zip(sizes, chosen, strict=True) if c) <= capacity
    got = sum(v for v, c in zip(values, chosen, strict=True) if c)
    assert got == pytest.approx(best, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(knapsack_instances)
def test_greedy_packing_never_beats_the_dp_optimum(instance):
    """Greedy (Algorithm 1 with skip) at batch limit b vs the DP over batch sizes <= b."""
    values, sizes, capacity, b = instance
    values = np.abs(np.array(values, dtype=float))  # QoE gains (average objective) are >= 0
    sizes = np.array(sizes, dtype=np.int64) + 1  # demand = context + 1 >= 1
    n = values.size
    order = np.argsort(-(values / sizes), kind="stable")
    greedy = pack_in_order(order, sizes, capacity, b, n)
    greedy_value = float(values[greedy].sum())
    dp_best = max(
        float(values[exact_k_knapsack(values, sizes, capacity, k)].sum()) for k in range(b + 1)
    )
    assert greedy_value <= dp_best + 1e-9
    # ... and the DP at exactly the greedy's batch size already matches or beats it.
    k = int(greedy.sum())
    assert greedy_value <= float(values[exact_k_knapsack(values, sizes, capacity, k)].sum()) + 1e-9


def test_exact_k_means_exactly_k_so_greedy_can_beat_it_at_the_same_b():
    """Eq. 4 fixes the batch size: with B = 2 the DP must take two items even if one is
    worth more on its own; greedy (at most B) takes the valuable one. Andes's search over
    B covers this (B = 1 is also tried)."""
    values, sizes = np.array([10.0, 0.0, 0.0]), np.array([10, 1, 1])
    np.testing.assert_array_equal(exact_k_knapsack(values, sizes, 10, 2), [False, True, True])
    np.testing.assert_array_equal(exact_k_knapsack(values, sizes, 10, 1), [True, False, False])
    greedy = pack_in_order(np.array([0, 1, 2]), sizes, 10, 2, 3)
    np.testing.assert_array_equal(greedy, [True, False, False])


def test_andes_greedy_gain_at_most_dp_on_real_gains():
    """On Andes's own gains (Eq. 2) for random tables, greedy <= the best DP up to B."""
    andes = Andes(FAST, horizon_s=5.0)
    for seed in range(25):
        table = random_table(seed, n_max=8)
        forecast = andes.forecast(table, now=20.0)
        gain = andes.gains(forecast, 20.0, float(FAST.decode_s(4)))
        demand = table.demand
        capacity = min(int(demand.sum() // 2) + 1, 200)
        for b in (1, 2, 4):
            order = andes.packing_order(table, gain / demand)
            greedy = pack_in_order(order, demand, capacity, b, table.n)
            best = max(
                float(gain[exact_k_knapsack(gain, demand, capacity, k)].sum()) for k in range(b + 1)
            )
            assert float(gain[greedy].sum()) <= best + 1e-9


def test_exact_k_knapsack_rejects_negative_inputs():
    with pytest.raises(ValueError, match="sizes"):
        exact_k_knapsack(np.array([1.0]), np.array([-1]), 5, 1)
    with pytest.raises(ValueError, match="capacity"):
        exact_k_knapsack(np.array([1.0]), np.array([1]), -1, 1)
    with pytest.raises(ValueError, match="k must"):
        exact_k_knapsack(np.array([1.0]), np.array([1]), 5, -1)


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


# -- VirtualTokenCounter ----------------------------------------------------------------
def test_vtc_service_and_weights():
    assert (W_PROMPT, W_OUTPUT) == (1.0, 2.0)
    vtc = VirtualTokenCounter()
    assert vtc.service(100, 10) == 120.0
    vtc.charge("a", 1.0, prompt_tokens=100, output_tokens=10)
    vtc.charge("b", 2.0, prompt_tokens=100, output_tokens=10)
    vtc.charge("c", 4.0, output_tokens=8)
    assert vtc.counter("a") == 120.0
    assert vtc.counter("b") == 60.0
    assert vtc.counter("c") == 4.0
    assert vtc.counter("nobody") == 0.0
    custom = VirtualTokenCounter(w_prompt=0.5, w_output=3.0)
    assert custom.service(10, 10) == 35.0
    with pytest.raises(ValueError, match="weight"):
        vtc.charge("a", 0.0, prompt_tokens=1)


def test_vtc_lift_to_min_queued_counter_when_others_are_queued():
    vtc = VirtualTokenCounter()
    vtc.enqueue("a")
    vtc.enqueue("b")
    vtc.charge("a", 1.0, output_tokens=50)  # a: 100
    vtc.charge("b", 1.0, output_tokens=20)  # b: 40
    vtc.enqueue("c")  # new: lifted to min(100, 40)
    assert vtc.counter("c") == 40.0
    vtc.charge("d", 1.0, output_tokens=100)  # d: 200, idle
    vtc.enqueue("d")  # already above the floor: keeps its own
    assert vtc.counter("d") == 200.0


def test_vtc_lift_to_last_leaver_when_nobody_is_queued():
    vtc = VirtualTokenCounter()
    vtc.enqueue("a")
    vtc.enqueue("b")
    vtc.charge("a", 1.0, output_tokens=10)  # 20
    vtc.charge("b", 1.0, output_tokens=30)  # 60
    vtc.dequeue("b")
    vtc.dequeue("a")  # a leaves last
    assert vtc.last_left == "a"
    vtc.enqueue("c")
    assert vtc.counter("c") == 20.0  # a's counter, not b's 60


def test_vtc_no_lift_while_active():
    vtc = VirtualTokenCounter()
    vtc.enqueue("a")
    vtc.enqueue("b")
    vtc.charge("b", 1.0, output_tokens=50)  # b: 100, a: 0
    vtc.enqueue("a")  # a is active already: no lift
    assert vtc.counter("a") == 0.0
    assert vtc.queued["a"] == 2


def test_vtc_first_tenant_starts_at_zero_and_dequeue_underflow_errors():
    vtc = VirtualTokenCounter()
    vtc.enqueue("a")
    assert vtc.counter("a") == 0.0
    vtc.dequeue("a")
    with pytest.raises(ValueError, match="tenant"):
        vtc.dequeue("a")
    with pytest.raises(ValueError, match="tenant"):
        vtc.dequeue("never-seen")
    assert vtc.queued["a"] == 0


# -- VTC policy -------------------------------------------------------------------------
def test_vtc_policy_admits_lowest_counter_tenants_earliest_request():
    policy = VTC()
    table = RequestTable()
    add(table, "a1", arrival=0.0, tenant="a")
    add(table, "b2", arrival=2.0, tenant="b")
    add(table, "b1", arrival=1.0, tenant="b")
    for r in range(table.n):
        policy.on_arrival(table, r, 0.0)
    policy.vtc.charge("a", 1.0, output_tokens=100)
    mask = policy.schedule(table, Capacity(kv_tokens=1000, max_batch=1), now=3.0)
    np.testing.assert_array_equal(mask, [False, False, True])


def test_vtc_policy_interleaves_tenants_in_one_round():
    policy = VTC()
    table = RequestTable()
    for i in range(4):
        add(table, f"a{i}", arrival=float(i), prompt=9, tenant="a")
    for i in range(4):
        add(table, f"b{i}", arrival=float(i) + 0.5, prompt=9, tenant="b")
    mask = policy.schedule(table, Capacity(kv_tokens=1000, max_batch=4), now=9.0)
    admitted = sorted(table.keys[r] for r in np.flatnonzero(mask))
    assert admitted == ["a0", "a1", "b0", "b1"]
    assert policy.vtc.counter("a") == 0.0  # the round charges a local copy only


def test_vtc_policy_interleaving_respects_weights():
    policy = VTC()
    table = RequestTable()
    for i in range(6):
        add(table, f"a{i}", arrival=float(i), prompt=10, tenant="a", weight=1.0)
        add(table, f"b{i}", arrival=float(i) + 0.5, prompt=10, tenant="b", weight=2.0)
    mask = policy.schedule(table, Capacity(kv_tokens=10_000, max_batch=6), now=9.0)
    tenants = [table.keys[r][0] for r in np.flatnonzero(mask)]
    assert tenants.count("a") == 2 and tenants.count("b") == 4


def test_vtc_policy_stops_at_first_that_does_not_fit_and_keeps_running():
    policy = VTC()
    table = RequestTable()
    add(table, "run", arrival=0.0, prompt=49, tenant="b", running=True)  # 50
    add(table, "a-big", arrival=1.0, prompt=99, tenant="a")  # 100: does not fit in 60
    add(table, "b-small", arrival=2.0, prompt=0, tenant="b")  # 1: would fit
    policy.vtc.charge("b", 1.0, output_tokens=10)  # b ahead: a goes first
    mask = policy.schedule(table, Capacity(kv_tokens=110, max_batch=8), now=3.0)
    np.testing.assert_array_equal(mask, [True, False, False])
    # Slots: one running, max_batch 2 -> one admission.
    table2 = RequestTable()
    add(table2, "run", prompt=5, tenant="a", running=True)
    add(table2, "w1", arrival=1.0, prompt=5, tenant="b")
    add(table2, "w2", arrival=2.0, prompt=5, tenant="c")
    mask2 = VTC().schedule(table2, Capacity(kv_tokens=1000, max_batch=2), now=3.0)
    np.testing.assert_array_equal(mask2, [True, True, False])


def test_vtc_policy_hooks_charge_prompt_and_output():
    policy = VTC()
    table = RequestTable()
    r = add(table, "x", prompt=30, tenant="t", weight=2.0)
    policy.on_arrival(table, r, 0.0)
    policy.on_prefill(table, r, 30)
    policy.on_tokens(table, r, 5)
    assert policy.vtc.counter("t") == pytest.approx((30 + 2 * 5) / 2.0)
    policy.on_finish(table, r, 1.0)
    assert policy.vtc.queued["t"] == 0


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
        counters = tenant_counters(policy, engine.table)
        if counters:
            max_gap = max(max_gap, abs(counters["a"] - counters["b"]))
        now = res.end
    return {
        "counters": tenant_counters(policy, engine.table),
        "service": service,
        "ratio": service["b"] / service["a"],
        "max_gap": max_gap,
        "b_max": max_batch,
        "l_input": max(prompts.values()),
        "iters": iters,
        "preemptions": engine.total_preemptions,
    }


@pytest.fixture(scope="module")
def fair_run():
    return run_backlogged(
        tokenpace_andes(BACKLOG_PROFILE, fair_share_slack=500.0, preemption_cap=100.0)
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


def test_shipped_preemption_cap_still_shares_by_weight():
    run = run_backlogged(tokenpace_andes(BACKLOG_PROFILE, fair_share_slack=500.0))
    assert run["ratio"] == pytest.approx(2.0, rel=0.10), run


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


# -- constructor validation -------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: RoundRobin(interval=0), "interval"),
        (lambda: Andes(FAST, objective="fastest"), "objective"),
        (lambda: Andes(FAST, qoe="linear"), "qoe"),
        (lambda: Andes(FAST, kv_watermark=0.0), "kv_watermark"),
        (lambda: Andes(FAST, kv_watermark=1.5), "kv_watermark"),
        (lambda: Andes(FAST, kv_watermark=math.nan), "kv_watermark"),
        (lambda: Andes(FAST, preemption_cap=-1.0), "preemption_cap"),
        (lambda: Andes(FAST, batch_candidates=0), "batch_candidates"),
        (lambda: Andes(FAST, fair_share_slack=-1.0), "fair_share_slack"),
        (lambda: Andes(FAST, fair_share_slack=math.nan), "fair_share_slack"),
    ],
)
def test_invalid_constructor_arguments_raise_value_error_naming_them(make, argument):
    with pytest.raises(ValueError, match=argument):
        make()


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: Andes(FAST, horizon_s=0.0), "horizon_s"),
        (lambda: Andes(FAST, horizon_s=-5.0), "horizon_s"),
        (lambda: VirtualTokenCounter(w_prompt=-1.0), "w_prompt"),
        (lambda: VirtualTokenCounter(w_output=0.0), "w_output"),
    ],
)
def test_unvalidated_constructor_arguments(make, argument):
    """Regression: these constructors accept nonsense silently (a horizon at or before now makes
    every gain 0; a non-positive VTC weight makes service lower a counter)."""
    with pytest.raises(ValueError, match=argument):
        make()


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


def test_registry_builds_every_named_policy_and_names_the_choices():
    from qos.policy.registry import POLICIES, make_policy

    for name in POLICIES:
        assert isinstance(make_policy(name, FAST), Policy)
    shipped = make_policy("andes-tp", FAST)
    assert (shipped.preemption_cap, shipped.preemption_cost) == (0.3, 4.0)
    paper = make_policy("andes", FAST)
    assert (paper.preemption_cap, paper.preemption_cost) == (1.0, 0.0)
    with pytest.raises(ValueError, match="unknown 'lifo'; use one of fcfs, round-robin"):
        make_policy("lifo", FAST)


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
