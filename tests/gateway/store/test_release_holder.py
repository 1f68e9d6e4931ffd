"""A worker that died: its slots and queue places dropped from Redis in one call, by the
holder tag its request ids begin with (:mod:`gateway.runtime.holders`); everyone else's
stay (a real redis-server)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.store import Arrival, RedisStore, Slot

LEASE = 60.0
SLOTS = [Slot("b1", 1), Slot("b2", 1)]
GONE, ALIVE = "deadbeef", "cafef00d"


@pytest.fixture
async def store(redis_server, key_prefix) -> AsyncIterator[RedisStore]:
    s = RedisStore(redis_server.url, key_prefix)
    try:
        yield s
    finally:
        await s.aclose()


def arrival(rid: str, tenant: str) -> Arrival:
    return Arrival(rid, tenant, 1.0, "m", "chat", 1.0, 4.8, prompt_tokens=10, expected_tokens=20)


async def test_a_gone_holders_slots_and_queue_places_are_dropped(store: RedisStore) -> None:
    assert (await store.arrive(arrival(GONE + "01", "a"), SLOTS, LEASE)).backend == "b1"
    assert (await store.arrive(arrival(ALIVE + "01", "b"), SLOTS, LEASE)).backend == "b2"
    assert (await store.arrive(arrival(GONE + "02", "a"), SLOTS, LEASE)).status == "full"
    assert (await store.arrive(arrival(ALIVE + "02", "b"), SLOTS, LEASE)).status == "queued"

    assert await store.release_holder(GONE, ["b1", "b2"]) == 2  # a slot and a queue place

    assert [await store.in_flight(b) for b in ("b1", "b2")] == [0, 1]
    assert (await store.retry(GONE + "02", SLOTS, LEASE)).status == "gone"
    # the other holder's waiter, at the head of the queue now, gets the freed slot
    assert (await store.retry(ALIVE + "02", SLOTS, LEASE)).backend == "b1"
    assert await store.release_holder(GONE, ["b1", "b2"]) == 0  # nothing left to drop
    assert [await store.in_flight(b) for b in ("b1", "b2")] == [1, 1]
