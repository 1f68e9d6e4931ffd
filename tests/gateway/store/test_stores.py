"""One suite, two stores: the in-memory store and Redis (a real redis-server).

The VTC cases drive :class:`qos.fairness.VirtualTokenCounter` with the same events and
compare counters: the Lua scripts must be the atomic form of that class.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.exceptions import ResponseError

from gateway.store import (
    Arrival,
    Limits,
    MemoryStore,
    QoERecord,
    RedisStore,
    RequestInfo,
    Slot,
    Store,
)
from gateway.store.ratelimit import WINDOW_MS, wait_ms
from qos.fairness import VirtualTokenCounter

LEASE = 10.0
ONE = [Slot("b1", 1)]


@pytest.fixture(params=["memory", "redis"])
async def store(request, key_prefix) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield MemoryStore()
        return
    server = request.getfixturevalue("redis_server")
    s = RedisStore(server.url, key_prefix)
    try:
        yield s
    finally:
        await s.aclose()


def arrival(rid: str, tenant: str, weight: float = 1.0, prompt: int = 10, **kw) -> Arrival:
    fields = {
        "model": "m",
        "tier": "chat",
        "ttft_s": 1.0,
        "tds": 4.8,
        "expected_tokens": 20,
        **kw,
    }
    return Arrival(rid, tenant, weight, prompt_tokens=prompt, **fields)


async def test_vtc_matches_reference(store: Store) -> None:
    ref = VirtualTokenCounter()

    async def check() -> None:
        got = await store.counters()
        for tenant, value in ref.counters.items():
            assert got.get(tenant, 0.0) == pytest.approx(value), tenant

    # a admitted at once: enqueue, dequeue, prompt charge
    a = await store.arrive(arrival("a1", "a", 1.0, prompt=10), ONE, LEASE)
    assert (a.status, a.backend) == ("admitted", "b1")
    ref.enqueue("a")
    ref.dequeue("a")
    ref.charge("a", 1.0, prompt_tokens=10)
    await check()
    # b (weight 2) is the head but the only slot is taken; c joins and is lifted to b's
    b = await store.arrive(arrival("b1", "b", 2.0, prompt=30), ONE, LEASE)
    assert b.status == "full" and b.head == "b1"
    ref.enqueue("b")
    await store.charge({"a": (1.0, 7, 86400)})
    ref.charge("a", 1.0, output_tokens=7)
    c = await store.arrive(arrival("c1", "c", 1.0, prompt=4), ONE, LEASE)
    assert c.status == "queued" and c.head == "b1"  # same counter, b's deadline is earlier
    ref.enqueue("c")
    await check()
    # the slot frees: b goes first (prompt 30 / weight 2), then c waits for room again
    await store.release("a1", "b1")
    assert (await store.retry("c1", ONE, LEASE)).status == "queued"
    got = await store.retry("b1", ONE, LEASE)
    assert (got.status, got.backend) == ("admitted", "b1")
    ref.dequeue("b")
    ref.charge("b", 2.0, prompt_tokens=30)
    assert got.counter == pytest.approx(ref.counter("b"))
    assert (await store.retry("c1", ONE, LEASE)).status == "full"
    await store.charge({"b": (2.0, 11, 86400), "a": (1.0, 3, 86400)})
    ref.charge("b", 2.0, output_tokens=11)
    ref.charge("a", 1.0, output_tokens=3)
    await check()
    # c leaves (its client went away): the last tenant to leave is c
    await store.leave("c1")
    ref.dequeue("c")
    # d arrives with nobody queued: lifted to the last leaver's counter (c's)
    await store.release("b1", "b1")
    d = await store.arrive(arrival("d1", "d", 1.0, prompt=2), ONE, LEASE)
    ref.enqueue("d")
    ref.dequeue("d")
    ref.charge("d", 1.0, prompt_tokens=2)
    assert d.status == "admitted"
    await check()
    # a returns while e is queued: lifted to e's counter, not banked from its idle time
    e = await store.arrive(arrival("e1", "e", 1.0, prompt=1), ONE, LEASE)
    ref.enqueue("e")
    assert e.status == "full"
    await store.charge({"e": (1.0, 50, 86400)})
    ref.charge("e", 1.0, output_tokens=50)
    a2 = await store.arrive(arrival("a2", "a", 1.0, prompt=1), ONE, LEASE)
    ref.enqueue("a")
    assert a2.status == "queued" and a2.head == "e1"
    await check()
    assert ref.counter("a") == ref.counter("e") > 30  # lifted past its own 30


async def test_head_is_least_counter_then_deadline(store: Store) -> None:
    assert (await store.arrive(arrival("x", "hog", prompt=5), ONE, LEASE)).status == "admitted"
    await store.charge({"hog": (1.0, 100, 86400)})
    # the hog queues first (fast tier, earlier deadline) but light has the lower counter
    slow = arrival("h2", "hog", prompt=5, ttft_s=0.1)
    assert (await store.arrive(slow, ONE, LEASE)).status == "full"
    light = await store.arrive(arrival("l1", "light", prompt=5, ttft_s=5.0), ONE, LEASE)
    # lifted to the least queued counter (hog's): tie on counter, hog's deadline first
    assert light.status == "queued" and light.head == "h2"
    # within a tenant, the earliest deadline goes first
    assert (await store.arrive(arrival("h3", "hog", ttft_s=0.01), ONE, LEASE)).head == "h3"
    await store.release("x", "b1")
    assert (await store.retry("h3", ONE, LEASE)).status == "admitted"
    # hog's counter grew by the prompt: light is now the least
    assert (await store.retry("h2", ONE, LEASE)).head == "l1"


async def test_a_tenant_at_its_cap_waits_behind_the_others(store: Store) -> None:
    slots = [Slot("b1", 4)]
    cap = Limits(max_concurrent=3)
    hog = [
        await store.arrive(arrival(f"h{i}", "hog", ttft_s=0.01, limits=cap), slots, LEASE)
        for i in range(4)
    ]
    # a free slot, but the hog holds its 3: its 4th request is nobody's head
    assert [h.status for h in hog] == ["admitted"] * 3 + ["queued"]
    assert hog[3].head is None
    # light is lifted to the hog's counter and its deadline is later: admission_order
    # puts h3 first, yet h3's tenant is at its cap, so light takes the slot
    light = await store.arrive(arrival("l1", "light", ttft_s=5.0, limits=cap), slots, LEASE)
    assert (light.status, light.backend) == ("admitted", "b1")
    full = await store.arrive(arrival("l2", "light", ttft_s=5.0, limits=cap), slots, LEASE)
    assert (full.status, full.head) == ("full", "l2")
    # the capped tenant's requests stand last, behind those that can be admitted
    standing = await store.standing("m", ["h3", "l2"], slots)
    assert standing.places == {"l2": 1, "h3": 2}
    # one of the hog's streams ends: below its cap, its request is the head again
    await store.release("h0", "b1")
    assert (await store.retry("h3", slots, LEASE)).status == "admitted"
    # a cap applies on a backend without one too; no cap (0) is none
    free = [Slot("x", 0)]
    one = Limits(max_concurrent=1)
    assert (await store.arrive(arrival("o1", "t", model="o", limits=one), free, LEASE)).backend
    second = await store.arrive(arrival("o2", "t", model="o", limits=one), free, LEASE)
    assert (second.status, second.head) == ("queued", None)
    other = await store.arrive(arrival("o3", "u", model="o"), free, LEASE)
    assert other.status == "admitted"
    await store.leave("o2")
    again = await store.arrive(arrival("o4", "t", model="o"), free, LEASE)
    assert again.status == "admitted"


async def test_slots_by_capacity_and_order(store: Store) -> None:
    slots = [Slot("big", 2), Slot("small", 1)]
    got = [await store.arrive(arrival(f"r{i}", "t"), slots, LEASE) for i in range(4)]
    assert [g.backend for g in got] == ["big", "big", "small", None]
    assert got[3].status == "full"
    assert await store.in_flight("big") == 2
    unlimited = await store.arrive(arrival("u", "t", model="other"), [Slot("x", 0)], LEASE)
    assert unlimited.status == "admitted"


async def test_move_takes_the_slot_to_a_backend_with_room(store: Store) -> None:
    slots = [Slot("a", 1), Slot("b", 1), Slot("c", 1)]
    assert (await store.arrive(arrival("r1", "t"), slots, LEASE)).backend == "a"
    assert (await store.arrive(arrival("r2", "t"), slots, LEASE)).backend == "b"
    # b is full: nothing moves, r1 still counts on a
    assert not await store.move("r1", "a", Slot("b", 1), LEASE)
    assert [await store.in_flight(n) for n in "abc"] == [1, 1, 0]
    # c has room: the slot leaves a and counts on c, in one step
    assert await store.move("r1", "a", Slot("c", 1), LEASE)
    assert [await store.in_flight(n) for n in "abc"] == [0, 1, 1]
    # a's freed slot is granted again; a backend without a cap always has room
    assert (await store.arrive(arrival("r3", "t"), slots, LEASE)).backend == "a"
    assert await store.move("r3", "a", Slot("d", 0), LEASE)
    assert await store.in_flight("d") == 1
    # released from where it moved to: every count back to zero
    for rid, backend in (("r1", "c"), ("r2", "b"), ("r3", "d")):
        await store.release(rid, backend)
    assert [await store.in_flight(n) for n in "abcd"] == [0, 0, 0, 0]


async def test_leases_lapse_and_renew_recreates(store: Store) -> None:
    assert (await store.arrive(arrival("a", "t"), ONE, 0.05)).status == "admitted"
    assert (await store.arrive(arrival("b", "t"), ONE, 0.05)).status == "full"
    await asyncio.sleep(0.12)
    # b's queue place lapsed too (its replica stopped renewing): gone
    assert (await store.retry("b", ONE, LEASE)).status == "gone"
    c = await store.arrive(arrival("c", "t"), ONE, LEASE)
    assert c.status == "admitted"  # a's slot lapsed
    await store.release("c", "b1")
    await store.renew([("b1", "c")], [], LEASE)  # a holder re-registers a lost slot
    assert await store.in_flight("b1") == 1


async def test_each_lease_lapses_when_it_ends_not_before(store: Store) -> None:
    # the store checks leases only once the earliest may have ended: the next earliest,
    # and a lease renewed past its end, still lapse on time, not before
    assert (await store.arrive(arrival("a", "t"), [Slot("b1", 1)], 0.05)).status == "admitted"
    assert (await store.arrive(arrival("b", "t"), [Slot("b2", 1)], 0.4)).status == "admitted"
    assert (await store.arrive(arrival("c", "t"), [Slot("b3", 1)], 0.05)).status == "admitted"
    await store.renew([("b3", "c")], [], 0.4)
    await asyncio.sleep(0.15)
    assert [await store.in_flight(b) for b in ("b1", "b2", "b3")] == [0, 1, 1]
    await asyncio.sleep(0.4)
    assert [await store.in_flight(b) for b in ("b1", "b2", "b3")] == [0, 0, 0]


async def test_queue_bound(store: Store) -> None:
    lim = Limits(max_queued=2)
    statuses = [
        (await store.arrive(arrival(f"q{i}", "t", limits=lim), [], LEASE)).status for i in range(3)
    ]
    assert statuses == ["full", "queued", "queue_full"]
    await store.leave("q0")
    assert (await store.arrive(arrival("q3", "t", limits=lim), [], LEASE)).status == "queued"


async def test_requests_per_minute(store: Store) -> None:
    lim = Limits(requests_per_minute=3)
    out = [
        await store.arrive(arrival(f"r{i}", "t", limits=lim), [Slot("b", 0)], LEASE)
        for i in range(5)
    ]
    assert [o.status for o in out] == ["admitted"] * 3 + ["limited"] * 2
    assert [o.rate.remaining_requests for o in out[:3]] == [2, 1, 0]
    assert out[3].limited_by == "requests"
    assert 0 < out[3].retry_after_ms <= 2 * WINDOW_MS
    assert out[0].rate.headers()["x-ratelimit-limit-requests"] == "3"
    # another tenant is not affected
    other = await store.arrive(arrival("o", "u", limits=lim), [Slot("b", 0)], LEASE)
    assert other.status == "admitted"


async def test_refused_requests_share_the_requests_per_minute_window(store: Store) -> None:
    lim = Limits(requests_per_minute=3)
    assert [(await store.count_request("t", 3))[0] for _ in range(2)] == [True, True]
    first = await store.arrive(arrival("a1", "t", limits=lim), [Slot("b", 0)], LEASE)
    assert (first.status, first.rate.remaining_requests) == ("admitted", 0)
    refused, wait = await store.count_request("t", 3)
    assert not refused and 0 < wait <= 2 * WINDOW_MS
    second = await store.arrive(arrival("a2", "t", limits=lim), [Slot("b", 0)], LEASE)
    assert second.status == "limited"
    assert (await store.count_request("u", 3))[0]  # another tenant's window


async def test_tokens_per_minute_and_budget(store: Store) -> None:
    lim = Limits(tokens_per_minute=100)
    first = await store.arrive(arrival("a", "t", prompt=30, limits=lim), [Slot("b", 0)], LEASE)
    assert first.status == "admitted" and first.rate.remaining_tokens == 70
    await store.charge({"t": (1.0, 60, 86400)})  # streamed output counts too
    second = await store.arrive(arrival("b", "t", prompt=5, limits=lim), [Slot("b", 0)], LEASE)
    assert (second.status, second.limited_by) == ("limited", "tokens")
    budget = Limits(token_budget=50, budget_period_s=3600)
    ok = await store.arrive(arrival("c", "u", prompt=40, limits=budget), [Slot("b", 0)], LEASE)
    assert ok.status == "admitted"
    await store.charge({"u": (1.0, 20, 3600)})
    over = await store.arrive(arrival("d", "u", prompt=1, limits=budget), [Slot("b", 0)], LEASE)
    assert (over.status, over.limited_by) == ("limited", "budget")
    assert 0 < over.retry_after_ms <= 3600 * 1000


def test_window_arithmetic() -> None:
    # nothing in the windows: fits now; a cost above the limit never fits
    assert wait_ms(10, 1, 0, 0, 0.5) == 0
    assert wait_ms(10, 11, 0, 0, 0.5) == -1
    # full previous window: fits once enough of it has faded
    assert wait_ms(10, 1, 10, 0, 0.0) == pytest.approx(0.1 * WINDOW_MS)
    # full current window: waits into the next one
    assert wait_ms(10, 1, 0, 10, 0.5) == pytest.approx(0.6 * WINDOW_MS)


async def test_keys(store: Store) -> None:
    await store.seed_keys({"d1": "acme", "d2": "acme", "d3": "basic"}, {"acme": "{}"})
    assert await store.tenant_for_key("d1") == "acme"
    assert await store.tenant_keys("acme") == ["d1", "d2"]
    assert not await store.revoke_key("basic", "d1")  # not basic's key
    assert await store.revoke_key("acme", "d1")
    await store.seed_keys({"d1": "acme"}, {})  # a restart does not bring it back
    assert await store.tenant_for_key("d1") is None
    await store.add_key("basic", "d4")
    assert await store.tenant_keys("basic") == ["d3", "d4"]


def rec(
    rid: str, tenant: str, side: str = "client", andes: float = 0.5, **reader: Any
) -> QoERecord:
    return QoERecord(rid, tenant, "chat", side, andes, andes, "completed", 0.9, 0.8, **reader)  # type: ignore[arg-type]


async def test_requests_and_qoe(store: Store) -> None:
    await store.remember("r1", RequestInfo("acme", "chat", 1.0, 4.8, "m"))
    assert await store.request_info("r1") == RequestInfo("acme", "chat", 1.0, 4.8, "m")
    assert await store.request_info("nope") is None

    results = await store.add_qoe(
        [rec("r1", "acme"), rec("r1", "acme"), rec("r1", "basic"), rec("r9", "acme")]
    )
    assert results == ["ok", "duplicate", "unknown", "unknown"]
    assert (await store.request_info("r1")) == RequestInfo(
        "acme", "chat", 1.0, 4.8, "m", reported=True
    )
    gateway = rec("r1", "acme", "gateway", 1.0, longest_freeze_s=2.5, freezes=3, idle_s=4.0)
    assert await store.add_qoe([gateway]) == ["ok"]
    got = await store.qoe_records(0.0, "acme")
    assert sorted((r.side, r.andes) for r in got) == [("client", 0.5), ("gateway", 1.0)]
    assert got[0].displayed_andes == 0.9 or got[1].displayed_andes == 0.9
    assert [r for r in got if r.side == "gateway"] == [dataclasses.replace(gateway, ts=got[1].ts)]
    assert await store.qoe_records(0.0, "basic") == []
    window = await store.qoe_window(60)
    client, gw = window[("acme", "chat", "client")], window[("acme", "chat", "gateway")]
    assert client["n"] == 1 and client["a"] == 0.5 and client["dn"] == 1 and "rn" not in client
    assert (gw["n"], gw["rn"], gw["fz"], gw["xf"], gw["xi"], gw["f2"]) == (1, 1, 3, 2.5, 4.0, 1)
    assert "f5" not in gw
    assert await store.qoe_window(60, "basic") == {}
    assert set(await store.qoe_window(60, "acme")) == set(window)
    # a batch of several tenants' gateway records: each tenant's aggregate gets its own
    batch = [rec(f"g{i}", ("acme", "basic", "zeta")[i % 3], "gateway") for i in range(9)]
    assert await store.add_qoe(batch) == ["ok"] * 9
    window = await store.qoe_window(60)
    assert [window[(t, "chat", "gateway")]["n"] for t in ("acme", "basic", "zeta")] == [4, 3, 3]


async def test_a_report_is_charged_only_when_it_is_stored(store: Store) -> None:
    """Ownership and reuse first, then the tenant's telemetry limit, in one step."""
    for rid in ("r1", "r2", "r3"):
        await store.remember(rid, RequestInfo("acme", "chat", 1.0, 4.8, "m"))
    assert await store.add_report(rec("r9", "acme"), 2) == ("unknown", 0.0)
    assert await store.add_report(rec("r1", "basic"), 2) == ("unknown", 0.0)
    assert await store.add_report(rec("r1", "acme"), 2) == ("ok", 0.0)
    for _ in range(5):  # a token replayed: refused, never charged
        assert await store.add_report(rec("r1", "acme"), 2) == ("duplicate", 0.0)
    assert await store.add_report(rec("r2", "acme"), 2) == ("ok", 0.0)
    result, wait = await store.add_report(rec("r3", "acme"), 2)
    assert result == "limited" and 0 < wait <= WINDOW_MS * 2
    assert (await store.request_info("r3")) == RequestInfo("acme", "chat", 1.0, 4.8, "m")
    assert (await store.qoe_window(60))[("acme", "chat", "client")]["n"] == 2


async def test_hit_and_merge(store: Store) -> None:
    assert [(await store.hit("t", "tel", 2))[0] for _ in range(3)] == [True, True, False]
    await store.charge({"t": (2.0, 10, 86400)})
    await store.merge_counters({"t": 5.0, "u": 3.0})
    got = await store.counters()
    assert got["t"] == pytest.approx(10.0) and got["u"] == pytest.approx(3.0)


async def test_shared_secret_is_set_once(store: Store) -> None:
    first = await store.shared_secret("telemetry_token", "a" * 64)
    second = await store.shared_secret("telemetry_token", "b" * 64)
    assert first == second == "a" * 64
    assert await store.shared_secret("other", "c" * 64) == "c" * 64


async def test_the_qoe_script_writes_nothing_of_a_record_it_refuses(
    redis_server, key_prefix
) -> None:
    """A number that is not finite never reaches Redis half written: the record is
    'invalid' and nothing of it is stored, the others are; an aggregate that is not finite
    is refused before any write."""
    store = RedisStore(redis_server.url, key_prefix)
    try:
        await store.remember("r1", RequestInfo("acme", "chat", 1.0, 4.8, "m"))
        good, poison = rec("r2", "acme", "gateway"), rec("r1", "acme")
        args = store._qoe_args([poison, good])
        args[args.index("andes") + 1] = "nan"  # the first record's andes
        assert [x.decode() for x in await store._add_qoe(args=args)] == ["invalid", "ok"]
        assert (await store.request_info("r1")).reported is False
        assert [r.request_id for r in await store.qoe_records(0.0)] == ["r2"]
        assert (await store.qoe_window(60))[("acme", "chat", "gateway")]["n"] == 1
        args = store._qoe_args([rec("r3", "acme", "gateway")])
        args[args.index("chat|gateway|a") + 1] = "inf"  # in the gateway records' aggregate
        with pytest.raises(ResponseError, match="not a set of finite numbers"):
            await store._add_qoe(args=args)
        assert [r.request_id for r in await store.qoe_records(0.0)] == ["r2"]
        assert (await store.qoe_window(60))[("acme", "chat", "gateway")]["n"] == 1
    finally:
        await store.aclose()


async def test_readers_skip_rows_that_are_not_records(redis_server, key_prefix) -> None:
    """Rows written by hand (or by an older gateway that let a NaN through) never spoil a
    summary: a record that does not read is skipped, a field that is not a number too."""
    store = RedisStore(redis_server.url, key_prefix)
    try:
        await store.add_qoe([rec("r1", "acme", "gateway", 0.75)])
        p = store.p
        bad = {"rid": "r2", "tenant": "acme", "tier": "chat", "side": "gateway"}
        await store.redis.xadd(p + "tel", {**bad, "andes": "nan", "monotone": "1", "outcome": "x"})
        await store.redis.xadd(p + "tel", {"rid": "r3"})
        assert [r.request_id for r in await store.qoe_records(0.0)] == ["r1"]
        (key,) = [k async for k in store.redis.scan_iter(match=p + "qa:10:*")]
        await store.redis.hset(key, mapping={"chat|gateway|a": "nan", "oops": "1", "x|y|n": "2"})
        window = await store.qoe_window(60)
        assert list(window) == [("acme", "chat", "gateway")]  # "x|y|n": no side "y"
        assert window[("acme", "chat", "gateway")]["n"] == 1
        assert "a" not in window[("acme", "chat", "gateway")]  # the NaN was dropped
    finally:
        await store.aclose()


async def test_every_script_checks_its_numbers_before_writing(redis_server, key_prefix) -> None:
    store = RedisStore(redis_server.url, key_prefix)
    try:
        with pytest.raises(ResponseError, match="not a weight"):
            await store.charge({"acme": (0.0, 10, 86400)})
        with pytest.raises(ResponseError, match="not a finite number"):
            await store.merge_counters({"acme": float("nan")})
        assert await store.counters() == {}
        with pytest.raises(ResponseError, match="not a finite number"):
            await store.arrive(arrival("r1", "acme", weight=float("inf")), ONE, LEASE)
        assert await store.request_info("r1") is None
        # a slot's cap, in the triples after the admission horizon: checked in each script
        bad = [Slot("b1", 1), Slot("b2", float("nan"))]  # type: ignore[arg-type]
        with pytest.raises(ResponseError, match="argument 27 is not a finite number"):
            await store.arrive(arrival("r2", "acme"), bad, LEASE)
        assert await store.request_info("r2") is None
        with pytest.raises(ResponseError, match="argument 11 is not a finite number"):
            await store.retry("r2", bad, LEASE)
        with pytest.raises(ResponseError, match="argument 10 is not a finite number"):
            await store.standing("m", ["r2"], bad)
        far = int(time.time() * 1000) + 3_600_000  # a budget period still running
        with pytest.raises(ResponseError, match="argument 7 is not a finite number"):
            await store.restore_budgets({("acme", far): 5.0, ("b", far): float("nan")})
        assert await store.redis.get(f"{store.p}b:acme:{far}") is None
        # the same arguments, well formed, are taken
        assert await store.restore_budgets({("acme", far): 5.0}) == 1
        assert await store.redis.get(f"{store.p}b:acme:{far}") == b"5"
        assert (await store.arrive(arrival("r2", "acme"), ONE, LEASE)).status == "admitted"
    finally:
        await store.aclose()
