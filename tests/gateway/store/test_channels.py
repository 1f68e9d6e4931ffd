"""The stores' channels (Store.publish / Store.subscribe): in process, on a real Redis
shared by two stores, through a Redis restart, and with Redis down (fail open: this
replica's own subscribers; fail closed: refused)."""

from __future__ import annotations

import pytest

from gateway.store import MemoryStore, RedisStore, ResilientStore, StoreUnavailable
from tests.support.ports import free_port
from tests.support.redis_server import RedisServer
from tests.support.waiting import eventually


async def test_the_memory_store_delivers_to_its_own_subscribers() -> None:
    store = MemoryStore()
    heard: list[bytes] = []
    store.subscribe("a", heard.append)
    await store.publish("a", b"one")
    await store.publish("b", b"not for a")
    assert heard == [b"one"]


async def test_every_store_on_one_redis_hears_it_and_again_after_a_restart(key_prefix) -> None:
    server = RedisServer().start()
    first, second = RedisStore(server.url, key_prefix), RedisStore(server.url, key_prefix)
    heard: list[bytes] = []  # the first store's
    also: list[bytes] = []  # the second's
    try:
        first.subscribe("ch", heard.append)
        second.subscribe("ch", also.append)
        listeners = first.listeners + second.listeners
        assert await eventually(lambda: all(x.subscribed.is_set() for x in listeners))
        await first.publish("ch", b"hello")
        assert await eventually(lambda: heard == also == [b"hello"])
        server.restart()
        await second.reset()  # the pool's connections died with the server
        for _ in range(50):  # until both subscribed again (what is sent before is lost)
            await second.publish("ch", b"again")
            if await eventually(lambda: b"again" in heard and b"again" in also, 0.2):
                break
        assert b"again" in heard and b"again" in also
    finally:
        await first.aclose()
        await second.aclose()
        server.stop()
    assert first.listeners == []


@pytest.mark.parametrize("fail_open", [True, False])
async def test_with_redis_down_a_replica_hears_itself_or_refuses(fail_open: bool) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    store = ResilientStore(
        RedisStore(url, "down", timeout_s=0.2), MemoryStore(), fail_open=fail_open
    )
    heard: list[bytes] = []
    await store.start()
    try:
        store.subscribe("ch", heard.append)
        if fail_open:
            await store.publish("ch", b"local")
            assert heard == [b"local"]
        else:
            with pytest.raises(StoreUnavailable):
                await store.publish("ch", b"refused")
            assert heard == []
    finally:
        await store.aclose()
