"""API key lookups through the store, cached per replica for ``store.key_cache_s``.

Keys live in the store as SHA-256 digests (configured ones are seeded at start-up, the
admin API adds and revokes others). A revocation takes effect at once on the replica
that made it and within ``key_cache_s`` on the others.
"""

from __future__ import annotations

import time

import anyio

from gateway.store import Store, StoreUnavailable

_MAX_ENTRIES = 100_000


class KeyCache:
    def __init__(self, store: Store, ttl_s: float, timeout_s: float = 2.0) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self._cache: dict[str, tuple[str | None, float]] = {}

    async def tenant(self, digest: str) -> str | None:
        """The tenant owning the key with this digest, or None; raises StoreUnavailable."""
        now = time.monotonic()
        hit = self._cache.get(digest)
        if hit is not None and hit[1] > now:
            return hit[0]
        try:
            with anyio.fail_after(self.timeout_s):
                name = await self.store.tenant_for_key(digest)
        except TimeoutError as exc:
            raise StoreUnavailable("key lookup timed out") from exc
        if self.ttl_s > 0:
            if len(self._cache) >= _MAX_ENTRIES:
                self._cache.clear()
            self._cache[digest] = (name, now + self.ttl_s)
        return name

    def forget(self, digest: str) -> None:
        self._cache.pop(digest, None)
