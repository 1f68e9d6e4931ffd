"""The VTC policy: the least-served tenant's oldest request first, by weight, never preempting."""

from __future__ import annotations

import numpy as np
import pytest

from qos.policy.table import Capacity, RequestTable
from qos.policy.vtc import VTC
from tests.support.policy import add


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
