"""Redis channels heard by one replica: a task per channel on a connection of its own.

:meth:`RedisStore.subscribe <gateway.store.redis.RedisStore.subscribe>` starts a
:class:`ChannelListener`: it SUBSCRIBEs on a client outside the store's pool (a
subscribed connection can send nothing else, and must not hold one of the pool's), hands
each message to its handler on the event loop, and, when Redis goes away, subscribes
again with a backoff (``RECONNECT_S`` doubling to ``RECONNECT_MAX_S``). Redis keeps no
message for a subscriber that is not connected: what is published meanwhile is lost,
which the channel's users accept (a reader signal is re-sent by its client).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.background import stop

log = logging.getLogger("tokenpace.gateway.store")

RECONNECT_S = 0.1
RECONNECT_MAX_S = 5.0
HEALTH_CHECK_S = 30
POLL_S = 1.0  # a wait for the next message ends this often (the loop stays cancellable)


class ChannelListener:
    """One channel's subscription, kept up until :meth:`aclose`."""

    def __init__(self, url: str, channel: str, handler: Callable[[bytes], None]) -> None:
        self.channel = channel
        self.handler = handler
        self.subscribed = asyncio.Event()  # set while the subscription is live
        # the health check PINGs an idle subscription: a connection that died without a
        # word (a silent network) is found and replaced
        self._client: aioredis.Redis = aioredis.from_url(
            url, max_connections=1, health_check_interval=HEALTH_CHECK_S
        )
        self._task = asyncio.get_running_loop().create_task(
            self._listen(), name=f"tokenpace-subscribe-{channel}"
        )

    async def _listen(self) -> None:
        backoff = RECONNECT_S
        while True:
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                self.subscribed.set()
                backoff = RECONNECT_S
                while True:
                    message = await pubsub.get_message(timeout=POLL_S)
                    if message is not None and message["type"] == "message":
                        self._deliver(message["data"])
            except (RedisError, OSError) as exc:
                self.subscribed.clear()
                log.warning("channel %s: %r; subscribing again in %g s", self.channel, exc, backoff)
            finally:
                await pubsub.aclose()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, RECONNECT_MAX_S)

    def _deliver(self, data: bytes) -> None:
        try:
            self.handler(data)
        except Exception:  # one bad message never ends the subscription
            log.exception("channel %s: the handler failed", self.channel)

    async def aclose(self) -> None:
        await stop(self._task)
        await self._client.aclose()
