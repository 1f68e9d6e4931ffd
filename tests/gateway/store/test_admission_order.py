"""The admission order (gateway/store/queue.py): the rule on hand-made cases, and both
stores (in memory, and Redis's Lua on a real redis-server) against the shared vectors
generated from it (tests/vectors/admission.json, scripts/make_admission_vectors.py)."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from gateway.store import Arrival, MemoryStore, RedisStore, Slot, Store
from gateway.store.queue import (
    ADMISSION_HORIZON_S,
    Queued,
    admission_interval,
    admission_order,
    capacity_of,
    capped_last,
    concurrency_cap,
)
from tests.support.paths import VECTORS

VECTOR_FILE = json.loads((VECTORS / "admission.json").read_text())
LEASE = 30.0


def q(rid: str, tenant: str, deadline: float) -> Queued:
    return Queued(rid, tenant, deadline)


def test_the_requests_of_a_tenant_at_its_cap_come_last() -> None:
    order = ["a1", "b1", "a2", "c1"]
    tenant_of = {"a1": "a", "a2": "a", "b1": "b", "c1": "c"}
    # a at its cap (3 of 3), b below (1 of 2), c without one
    holds, caps = {"a": 3, "b": 1, "c": 7}, {"a": 3, "b": 2}
    assert capped_last(order, tenant_of, holds, caps) == ["b1", "c1", "a1", "a2"]
    assert capped_last(order, tenant_of, {"a": 2}, caps) == order


def test_the_default_cap_keeps_one_slot_out_of_any_tenants_reach() -> None:
    assert concurrency_cap(None, 4, tenants=2) == 3
    # alone, or on a single slot, or on an uncapped backend: nothing to keep
    assert concurrency_cap(None, 4, tenants=1) == 0
    assert concurrency_cap(None, 1, tenants=5) == 0
    assert concurrency_cap(None, None, tenants=5) == 0
    # a plan's own cap applies as set, capped backends or not
    assert concurrency_cap(2, 4, tenants=2) == 2
    assert concurrency_cap(6, None, tenants=1) == 6


def test_within_plan_first_then_beyond_by_weight() -> None:
    """5 slots, free (w 1) holds none, ent (w 4) holds 3, each has 2 queued. Shares:
    free 1, ent 4: one request of each is within its plan, those go first, by deadline;
    then the others, ent's first."""
    queued = [q("f1", "free", 1), q("f2", "free", 2), q("e1", "ent", 5), q("e2", "ent", 6)]
    weights, holds = {"free": 1, "ent": 4}, {"ent": 3}
    assert admission_order(queued, holds, weights, {}, 5) == ["f1", "e1", "e2", "f2"]
    # 4 slots, free holds 3: ent wants only its 2 queued and keeps them (within), free's
    # share is the other 2, which it holds already: both of free's go last, though its
    # deadlines are earlier and its counter lower
    order = admission_order(queued, {"free": 3}, weights, {"free": 0, "ent": 99}, 4)
    assert order == ["e1", "e2", "f1", "f2"]


def test_beyond_plan_the_higher_weight_then_the_least_counter() -> None:
    # 2 slots, both held by m (w 2): every share is under one slot, nobody is within plan
    queued = [q("a1", "a", 1), q("b1", "b", 2), q("c1", "c", 3), q("d1", "d", 0.5)]
    weights = {"a": 1, "b": 2, "c": 2, "d": 1, "m": 2}
    counters = {"a": 5, "b": 30, "c": 10, "d": 7}
    order = admission_order(queued, {"m": 2}, weights, counters, 2)
    assert order == ["c1", "b1", "a1", "d1"]


def test_ties_in_the_deadline_go_by_id() -> None:
    queued = [q("r2", "a", 1), q("r1", "b", 1), q("r0", "a", 2)]
    assert admission_order(queued, {}, {"a": 1, "b": 1}, {}, 2) == ["r1", "r2", "r0"]
    assert admission_order(queued, {}, {"a": 1, "b": 4}, {}, 2) == ["r1", "r2", "r0"]


def today(queued: list[Queued], counters: dict[str, float]) -> list[str]:
    """The queue's order before plans: the least counter, then deadline, then id."""
    ranked = sorted(queued, key=lambda x: (counters.get(x.tenant, 0.0), x.deadline, x.request_id))
    return [x.request_id for x in ranked]


def test_equal_weights_keep_the_vtc_order() -> None:
    """With one tenant, or every tenant present of one weight, the order is the one the
    queue had before plans: VTC's least counter, then deadline, then id, whatever the
    holds and the caps."""
    rng = random.Random(7)
    for _ in range(300):
        tenants = rng.sample(["a", "b", "c", "d"], rng.randint(1, 4))
        weight = rng.choice([0.5, 1.0, 3.0])
        queued = [q(f"r{i:02d}", rng.choice(tenants), float(rng.randint(0, 6))) for i in range(12)]
        counters = {t: float(rng.choice([0, 3, 3, 9])) for t in tenants}
        holds = {t: rng.randint(0, 3) for t in tenants}
        weights = dict.fromkeys(tenants, weight)
        capacity = rng.choice([None, 4, 8, 20])
        assert admission_order(queued, holds, weights, counters, capacity) == today(
            queued, counters
        )


def test_a_backend_without_a_cap_keeps_the_vtc_order() -> None:
    queued = [q("f1", "free", 1), q("e1", "ent", 2)]
    counters = {"free": 0.0, "ent": 5.0}
    order = admission_order(queued, {"free": 3}, {"free": 1, "ent": 4}, counters, None)
    assert order == today(queued, counters) == ["f1", "e1"]


def test_the_admission_interval() -> None:
    now = 1_000_000.0
    assert admission_interval([], now) == ADMISSION_HORIZON_S
    # four admissions over the last 2 s: one every half second
    assert admission_interval([now - 2000, now - 1500, now - 1000, now - 500], now) == 0.5
    # older than the horizon: forgotten
    old = now - ADMISSION_HORIZON_S * 1000 - 1
    assert admission_interval([old, now - 1000], now) == 1.0
    # a stall: the interval grows while nothing is admitted
    assert admission_interval([now - 1000], now + 9000) == 10.0


def test_the_committed_vectors_are_the_rule() -> None:
    """Each case's order is what the rule says today (else: scripts/make_admission_vectors.py)."""
    cases = VECTOR_FILE["cases"]
    for c in cases:
        queued = [Queued(*r) for r in c["queued"]]
        args = (c["holds"], c["weights"], c["counters"], capacity_of(c["caps"]))
        assert admission_order(queued, *args) == c["order"], c
    plans = [c for c in cases if len(set(c["weights"].values())) > 1 and 0 not in c["caps"]]
    assert len(cases) >= 40 and len(plans) >= 20
    # the vectors mean something: in many cases the order is not VTC's
    differ = 0
    for c in cases:
        queued = [Queued(*r) for r in c["queued"]]
        differ += c["order"] != today(queued, c["counters"])
    assert differ >= 10


@pytest.fixture(params=["memory", "redis"])
def stores(request, key_prefix) -> Callable[[int], Any]:
    """A fresh store per case: ``stores(i)`` is an async context manager."""

    @asynccontextmanager
    async def make(i: int) -> AsyncIterator[Store]:
        if request.param == "memory":
            yield MemoryStore()
            return
        server = request.getfixturevalue("redis_server")
        s = RedisStore(server.url, f"{key_prefix}-{i}")
        try:
            yield s
        finally:
            await s.aclose()

    return make


def arrival(rid: str, tenant: str, weight: float, ttft_s: float) -> Arrival:
    return Arrival(rid, tenant, weight, "m", "chat", ttft_s, 4.8, 0, 10)


async def set_up(store: Store, case: dict[str, Any]) -> list[Slot]:
    """Holds first (each admitted at once: nobody is queued), then the queued requests
    (no backend is a candidate: they queue), then the counters."""
    caps, weights = case["caps"], case["weights"]
    slots = [Slot(f"b{i}", cap) for i, cap in enumerate(caps)]
    n = itertools.count()
    for tenant, hold in case["holds"].items():
        for _ in range(hold):
            held = arrival(f"h{next(n)}", tenant, weights[tenant], 1)
            assert (await store.arrive(held, slots, LEASE)).status == "admitted"
    waiting = [Slot(s.backend, s.capacity, candidate=False) for s in slots]
    for rid, tenant, deadline in case["queued"]:
        got = await store.arrive(arrival(rid, tenant, weights[tenant], deadline), waiting, LEASE)
        assert got.status in ("queued", "full")
    await store.merge_counters(case["counters"])
    return waiting


async def test_both_stores_admit_in_the_vectors_order(stores) -> None:
    for i, case in enumerate(VECTOR_FILE["cases"]):
        async with stores(i) as store:
            slots = await set_up(store, case)
            order = case["order"]
            ids = [r[0] for r in case["queued"]]
            standing = await store.standing("m", ids, slots)
            assert standing.places == {rid: p for p, rid in enumerate(order, 1)}, (i, case)
            head = await store.retry(order[0], slots, LEASE)
            assert (head.status, head.head) == ("full", order[0]), i
            if len(order) > 1:
                other = await store.retry(order[-1], slots, LEASE)
                assert (other.status, other.head) == ("queued", order[0]), i
