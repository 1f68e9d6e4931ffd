"""FCFS: arrival order, head-of-line blocking, the batch limit, whole KV blocks."""

from __future__ import annotations

import numpy as np

from qos.policy.fcfs import FCFS
from qos.policy.table import Capacity, RequestTable
from qos.policy.vtc import VTC
from tests.support.policy import add


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
