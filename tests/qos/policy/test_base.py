"""``pack_in_order``, the packing primitive of every policy (qos/policy/base.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from qos.policy.base import pack_in_order


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
