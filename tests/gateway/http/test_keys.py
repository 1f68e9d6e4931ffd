"""The per-replica key cache: bounded LRUs, unknown keys apart from known ones."""

from __future__ import annotations

import secrets

from gateway.config.schema import hash_key
from gateway.http.keys import MAX_KEYS, KeyCache
from gateway.store import MemoryStore


class CountingStore(MemoryStore):
    """The in-memory store, counting key lookups."""

    def __init__(self) -> None:
        super().__init__()
        self.lookups = 0

    async def tenant_for_key(self, digest: str) -> str | None:
        self.lookups += 1
        return await super().tenant_for_key(digest)


async def test_a_spray_of_unknown_keys_never_evicts_a_tenants_key() -> None:
    store = CountingStore()
    good = hash_key("tp-good-key-000001")
    await store.seed_keys({good: "acme"}, {})
    cache = KeyCache(store, ttl_s=60.0)
    assert await cache.tenant(good) == "acme"
    for _ in range(MAX_KEYS + 1):  # more random keys than the whole cache holds
        assert await cache.tenant(secrets.token_hex(32)) is None
    before = store.lookups
    assert await cache.tenant(good) == "acme"
    assert store.lookups == before  # still cached
    assert len(cache.unknown) <= 10_000


async def test_unknown_keys_are_cached_briefly_and_forget_drops_both() -> None:
    store = CountingStore()
    digest = hash_key("tp-made-later-0001")
    cache = KeyCache(store, ttl_s=60.0)
    assert await cache.tenant(digest) is None
    assert await cache.tenant(digest) is None
    assert store.lookups == 1  # the miss is cached ...
    await store.add_key("acme", digest)
    cache.unknown.put(digest, None, 0.0)  # ... for at most a second: here, expired
    assert await cache.tenant(digest) == "acme"
    cache.forget(digest)
    assert await cache.tenant(digest) == "acme" and store.lookups == 3
