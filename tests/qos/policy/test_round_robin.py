"""Round robin: preemption after the interval, requeueing at the back."""

from __future__ import annotations

import numpy as np

from qos.policy.round_robin import RoundRobin
from qos.policy.table import Capacity, RequestTable
from tests.support.policy import add, apply_mask


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
