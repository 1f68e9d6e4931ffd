"""Which worker holds a slot: the holder tag at the start of its request ids.

Under ``tokenpace serve --workers N`` each worker begins the ids of its requests with a
tag derived from the pool's random id and its process id. Every admission slot and queue
place in the shared store is keyed by request id, so the supervisor, which knows both
when a worker exits, can drop everything a crashed worker held in one store call
(:meth:`gateway.store.redis.RedisStore.release_holder`) instead of leaving it to lapse
after ``admission.lease_s``. Only a tag's own requests match it; were two live workers
ever to share one (32 bits, a fresh pool id per serve), the survivor's next lease
renewal re-creates what it still holds.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.config.schema import GatewayConfig

log = logging.getLogger("tokenpace.gateway.workers")

TAG_HEX = 8  # the leading hex digits of a request id that name its worker


def holder_tag(pool_id: str, pid: int) -> str:
    """The tag of worker ``pid`` of the pool ``pool_id``: ``TAG_HEX`` hex digits."""
    digest = hashlib.blake2b(f"{pool_id}:{pid}".encode(), digest_size=TAG_HEX // 2)
    return digest.hexdigest()


def release_holder(config: GatewayConfig, tag: str) -> int:
    """Drop the slots and queue places of the requests tagged ``tag`` from ``config``'s
    Redis store; how many. A store error is logged: the leases still lapse."""
    from gateway.store.redis import RedisStore

    url = config.store.redis_url
    if url is None:
        return 0
    backends = [b.name for b in config.backends]

    async def run() -> int:
        store = RedisStore(url, config.store.key_prefix, timeout_s=config.store.timeout_s)
        try:
            return await store.release_holder(tag, backends)
        finally:
            await store.aclose()

    try:
        return asyncio.run(run())
    except Exception:
        log.warning("releasing the slots of worker tag %s failed", tag, exc_info=True)
        return 0
