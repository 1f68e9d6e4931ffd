"""The exact k-item knapsack (Andes Algorithm 2) against brute force and the greedy packing."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qos.policy.andes import Andes
from qos.policy.base import pack_in_order
from qos.policy.exact import exact_k_knapsack
from tests.support.policy import FAST, random_table


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
