"""Andes.schedule() against a plain statement of the same decision (Andes §4, Algorithm 1).

The policy evaluates one decision with shortcuts (a partial sort of the packing order,
no re-sort when the preemption budget is spent, ...); :func:`reference_schedule` does
the same decision the direct way: the full packing order for every candidate batch size,
then the preemption cap. The two must return the same mask on every table.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qos.latency import get_profile
from qos.policy.andes import UNGUARDED, Andes, tokenpace_andes
from qos.policy.base import pack_in_order
from qos.policy.exact import exact_k_knapsack
from qos.policy.table import Capacity, RequestTable

OPT = get_profile("opt-66b-4xa100")
LLAMA = get_profile("llama-3.1-8b-h100")


def reference_pack(
    table: RequestTable,
    levels: np.ndarray | None,
    asks: np.ndarray | None,
    order: np.ndarray,
    demand: np.ndarray,
    kv_tokens: int,
    max_batch: int,
) -> np.ndarray:
    """Greedy packing with skip (Algorithm 1); with tenant levels, once an asking row does
    not fit, every waiting row after it is passed over (qos/policy/fair.py)."""
    if levels is None or asks is None:
        return pack_in_order(order, demand, kv_tokens, max_batch, table.n)
    chosen = np.zeros(table.n, dtype=bool)
    used = count = 0
    blocked = False
    for row in order.tolist():
        if count >= max_batch:
            break
        if blocked and not table.running[row]:
            continue
        if used + demand[row] <= kv_tokens:
            chosen[row] = True
            used += int(demand[row])
            count += 1
        elif asks[row]:
            blocked = True
    return chosen


def reference_schedule(
    policy: Andes, table: RequestTable, capacity: Capacity, now: float
) -> np.ndarray:
    """One Andes decision, unoptimised: full sort per batch size, then the preemption cap."""
    n, running = table.n, table.running
    demand = capacity.demand(table)
    if not policy.triggered(table, capacity, demand):
        return np.ones(n, dtype=bool)
    forecast = policy.forecast(table, now)
    packing = Capacity(
        int(policy.kv_watermark * capacity.kv_tokens), capacity.max_batch, capacity.block_size
    )
    b_min, b_max = policy.batch_range(table, packing, demand)
    count = min(policy.batch_candidates, b_max - b_min + 1)
    sizes = sorted({round(b_min + (b_max - b_min) * i / max(count - 1, 1)) for i in range(count)})
    context_s = policy.profile.per_context_token_s * float(demand.mean())
    tau = float(policy.profile.decode_s(b_max)) + context_s * b_max
    asks = ~running & (forecast.q_serve(tau) - forecast.q_wait > 1e-9)
    levels = policy.shares.levels(table, asks) if policy.shares is not None else None
    best, best_value, best_order = None, -np.inf, None
    for b in sizes:
        gain = policy.gains(forecast, now, float(policy.profile.decode_s(b)) + context_s * b)
        if policy.preemption_cost:
            gain = gain - policy.stall_charge(forecast, gain, running)
        if levels is None:
            order = policy.packing_order(table, gain / demand)
        else:  # lowest level first, then Andes's order
            order = np.lexsort((~running, -(gain / demand), levels))
        if policy.solver is not None:
            chosen = policy.solver(gain, demand, packing.kv_tokens, b)
        else:
            chosen = reference_pack(table, levels, asks, order, demand, packing.kv_tokens, b)
        value = float(gain[chosen].sum())
        if value > best_value:
            best, best_value, best_order = chosen, value, order
    assert best is not None and best_order is not None
    budget = int(policy.preemption_cap * policy.arrivals) - policy.preemptions
    if policy.wait_for_room and budget > 0:
        claims = reference_claims(policy, table, forecast, tau)
        best = reference_only_for_claims(
            policy, table, capacity, demand, best, best_order, claims, asks, levels
        )
    # Optimisation #4, the preemption cap.
    evicted = running & ~best
    budget = int(policy.preemption_cap * policy.arrivals) - policy.preemptions
    if int(evicted.sum()) <= budget:
        policy.preemptions += int(evicted.sum())
        return best
    victims = np.flatnonzero(evicted)
    by_context = victims[np.argsort(-table.context[victims], kind="stable")]
    kept = best & running
    kept[by_context[: victims.size - max(budget, 0)]] = True
    packed = pack_in_order(np.flatnonzero(kept), demand, capacity.kv_tokens, capacity.max_batch, n)
    used, slots = int(demand[packed].sum()), capacity.max_batch - int(packed.sum())
    room = int(policy.kv_watermark * capacity.kv_tokens) - used
    if room > 0 and slots > 0:
        admissions = best_order[(best & ~running)[best_order]]
        packed |= reference_pack(table, levels, asks, admissions, demand, room, slots)
    policy.preemptions += int((running & ~packed).sum())
    return packed


def reference_claims(policy: Andes, table: RequestTable, forecast, tau: float) -> np.ndarray:
    """Waiting rows hurt by waiting 1/λ for room, compared when each would get its first
    token after that wait (the whole horizon before two completions)."""
    wait = policy.room_wait_s(forecast.now)
    claims = np.zeros(table.n, dtype=bool)
    for row in np.flatnonzero(~table.running).tolist():
        horizon = forecast.horizon
        if wait is not None:
            horizon = min(forecast.now + wait + float(forecast.first_delay[row]) + tau, horizon)
        at = forecast.of(np.arange(table.n), horizon)
        claims[row] = at.q_serve(tau)[row] - at.q_wait[row] > 1e-9
    return claims


def reference_only_for_claims(
    policy: Andes,
    table: RequestTable,
    capacity: Capacity,
    demand: np.ndarray,
    best: np.ndarray,
    order: np.ndarray,
    claims: np.ndarray,
    asks: np.ndarray,
    levels: np.ndarray | None,
) -> np.ndarray:
    """Preempt only for a claim: keep what runs and the admissions with a claim, then
    the evicted rows, longest context first, in the whole cache, then the other
    admissions under the watermark, in order (with levels, VTC's stop)."""
    running = table.running
    evicted = running & ~best
    if not evicted.any():
        return best
    kept = (best & running) | (best & ~running & claims)
    used, count = int(demand[kept].sum()), int(kept.sum())
    victims = np.flatnonzero(evicted)
    for row in victims[np.argsort(-table.context[victims], kind="stable")].tolist():
        if count < capacity.max_batch and used + demand[row] <= capacity.kv_tokens:
            kept[row], used, count = True, used + int(demand[row]), count + 1
    room = int(policy.kv_watermark * capacity.kv_tokens) - used
    if room > 0 and count < capacity.max_batch:
        admissions = order[(best & ~running & ~kept)[order]]
        kept |= reference_pack(
            table, levels, asks, admissions, demand, room, capacity.max_batch - count
        )
    return kept


def overloaded_table(
    rng: np.random.Generator,
    running: int,
    waiting: int,
    *,
    max_tokens: bool = False,
    weighted: bool = False,
) -> tuple[RequestTable, Capacity, float]:
    """Like bench/andes_decision.py: running requests mid-reply, the KV cache exactly full.
    ``weighted``: the three tenants weigh 1, 2 and 4, and a tenth of the requests ask for
    30 tokens/s, above the batch-1 speed of both profiles' engines."""
    table, now = RequestTable(), 600.0
    for i in range(running + waiting):
        fast = weighted and rng.random() < 0.1
        table.add(
            f"r{i}",
            arrival=now - rng.uniform(1.0, 120.0),
            prompt_tokens=int(rng.integers(4, 600)),
            ttft=float(rng.choice([0.0, 1.0, 3.0])),
            tds=30.0 if fast else float(rng.uniform(3.8, 5.1)),
            tenant=f"t{i % 3}",
            weight=float((1, 2, 4)[i % 3]) if weighted else 1.0,
            max_tokens=int(rng.integers(1, 400)) if max_tokens and rng.random() < 0.5 else None,
        )
    for row in rng.permutation(running + waiting)[:running].tolist():
        table.admit(row)
        start = float(table.col("arrival")[row]) + rng.uniform(0.2, 3.0)
        for k in range(int(rng.integers(1, 300))):
            if start + k * 0.15 >= now:
                break
            table.record_tokens(row, start + k * 0.15)
    return table, Capacity(kv_tokens=int(table.demand[table.running].sum()), max_batch=256), now


def assert_same_decisions(
    policy: Andes, table: RequestTable, capacity: Capacity, now: float, steps: int = 3
) -> None:
    """Successive decisions (the preemption budget shrinks) equal the reference's."""
    reference = copy.deepcopy(policy)
    for step in range(steps):
        expected = reference_schedule(reference, table, capacity, now + 0.01 * step)
        got = policy.schedule(table, capacity, now + 0.01 * step)
        np.testing.assert_array_equal(got, expected)
        assert policy.preemptions == reference.preemptions


def solver_of(profile, **options):
    """tokenpace's Andes without the reader guard: the solver's decision, which the
    reference states (the guard that reshapes it has tests of its own)."""
    return tokenpace_andes(profile, **{**UNGUARDED, **options})


POLICIES = {
    "andes": lambda profile: Andes(profile),
    "andes-tp": lambda profile: solver_of(profile),
    "monotone": lambda profile: solver_of(profile, qoe="monotone"),
    "max-min": lambda profile: Andes(profile, objective="max-min"),
    "perfect": lambda profile: solver_of(profile, objective="perfect"),
    "candidates": lambda profile: solver_of(profile, batch_candidates=6, horizon_s=3.0),
    "weighted": lambda profile: solver_of(profile, fair_share_slack=2000.0),
    "weighted-strict": lambda profile: solver_of(profile, fair_share_slack=0.0),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("policy_name", ["andes", "andes-tp", "weighted"])
@pytest.mark.parametrize("arrivals", [0, 300, 1280])  # budget spent, binding, loose
def test_bench_table_decisions_match_reference(seed, policy_name, arrivals):
    table, capacity, now = overloaded_table(
        np.random.default_rng(seed), 256, 1024, weighted=policy_name == "weighted"
    )
    policy = POLICIES[policy_name](OPT)
    policy.arrivals = arrivals
    assert_same_decisions(policy, table, capacity, now, steps=4)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    shape=st.tuples(st.integers(0, 120), st.integers(1, 200)),  # running, waiting
    policy_name=st.sampled_from(sorted(POLICIES)),
    profile=st.sampled_from([OPT, LLAMA]),
    kv_scale=st.sampled_from([0.3, 0.9, 1.0, 3.0]),
    max_batch=st.integers(1, 300),
    block_size=st.sampled_from([1, 16]),
    arrivals=st.integers(0, 400),
    max_tokens=st.booleans(),
)
def test_random_decisions_match_reference(
    seed, shape, policy_name, profile, kv_scale, max_batch, block_size, arrivals, max_tokens
):
    rng = np.random.default_rng(seed)
    weighted = policy_name.startswith("weighted")
    table, full, now = overloaded_table(rng, *shape, max_tokens=max_tokens, weighted=weighted)
    kv = max(1, int(kv_scale * max(full.kv_tokens, int(table.demand.sum()) // 4)))
    policy = POLICIES[policy_name](profile)
    policy.arrivals = arrivals
    assert_same_decisions(policy, table, Capacity(kv, max_batch, block_size), now)


@pytest.mark.parametrize("seed", range(16))
def test_decisions_with_the_exact_solver_match_reference(seed):
    table, full, now = overloaded_table(np.random.default_rng(seed), 4, 8)
    policy = solver_of(OPT, solver=exact_k_knapsack)
    policy.arrivals = seed
    assert_same_decisions(policy, table, Capacity(full.kv_tokens, 6), now)


def test_set_profile_refills_the_decode_caches() -> None:
    """A refitted profile (the vLLM plugin's online fit) is what the next decision uses."""
    old, new = get_profile("opt-66b-4xa100"), get_profile("llama-3.1-8b-h100")
    policy = Andes(old)
    np.testing.assert_allclose(policy.decode_table(8), old.decode_s(np.arange(9)))
    policy.set_profile(new)
    assert policy.profile is new
    np.testing.assert_allclose(policy.decode_table(8), new.decode_s(np.arange(9)))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("policy_name", ["andes-tp", "weighted"])
@pytest.mark.parametrize("gap_s", [0.01, 0.5])  # waits for room short and long
def test_decisions_with_a_completion_rate_match_reference(seed, policy_name, gap_s):
    """With completions seen, a claim compares the QoE after the wait for room."""
    rng = np.random.default_rng(seed)
    table, full, now = overloaded_table(rng, 120, 200, weighted=policy_name == "weighted")
    policy = POLICIES[policy_name](OPT)
    for row in range(table.n):
        policy.on_arrival(table, row, now)
    policy.arrivals = 300
    for k in range(10):
        policy.on_finish(table, k, now - (10 - k) * gap_s)
    assert policy.room_wait_s(now) == pytest.approx(gap_s)
    assert_same_decisions(policy, table, Capacity(full.kv_tokens, 256), now)
