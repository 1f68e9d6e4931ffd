"""API key lookups through the store, cached per replica.

Keys live in the store as SHA-256 digests (configured ones are seeded at start-up, the
admin API adds and revokes others). Two bounded LRU caches: keys found are kept for
``store.key_cache_s`` (at most :data:`MAX_KEYS` of them), keys not found for at most
:data:`NEGATIVE_TTL_S` (at most :data:`MAX_UNKNOWN`). A spray of random keys therefore
only ever evicts other unknown keys, never a tenant's, and a key just created on another
replica is accepted here within a second. A revocation takes effect at once on the
replica that made it and within ``key_cache_s`` on the others.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from gateway.store import Store

MAX_KEYS = 100_000
MAX_UNKNOWN = 10_000
NEGATIVE_TTL_S = 1.0


class _LRU:
    """At most ``size`` entries ``digest -> (value, expiry)``; the least recently used go."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[str, tuple[str | None, float]] = OrderedDict()

    def get(self, digest: str, now: float) -> tuple[str | None] | None:
        """``(value,)`` if cached and fresh, else None."""
        hit = self._data.get(digest)
        if hit is None:
            return None
        if hit[1] <= now:
            del self._data[digest]
            return None
        self._data.move_to_end(digest)
        return (hit[0],)

    def put(self, digest: str, value: str | None, expiry: float) -> None:
        self._data[digest] = (value, expiry)
        self._data.move_to_end(digest)
        while len(self._data) > self.size:
            self._data.popitem(last=False)

    def pop(self, digest: str) -> None:
        self._data.pop(digest, None)

    def __len__(self) -> int:
        return len(self._data)


class KeyCache:
    def __init__(self, store: Store, ttl_s: float) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.known = _LRU(MAX_KEYS)
        self.unknown = _LRU(MAX_UNKNOWN)

    async def tenant(self, digest: str) -> str | None:
        """The tenant owning the key with this digest, or None; raises StoreUnavailable."""
        now = time.monotonic()
        hit = self.known.get(digest, now) or self.unknown.get(digest, now)
        if hit is not None:
            return hit[0]
        name = await self.store.tenant_for_key(digest)
        if self.ttl_s > 0:
            if name is None:
                self.unknown.put(digest, None, now + min(self.ttl_s, NEGATIVE_TTL_S))
            else:
                self.known.put(digest, name, now + self.ttl_s)
        return name

    def forget(self, digest: str) -> None:
        self.known.pop(digest)
        self.unknown.pop(digest)
