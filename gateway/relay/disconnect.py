"""Cancelling a request's work when its client disconnects, or, before the response, when
the gateway's drain runs out.

Starlette does not cancel a handler whose client went away. :class:`DisconnectWatch`
does, for the awaits before the response (admission, opening the backend request, a
whole non-streaming response) and then for a stream's body
(:class:`~gateway.relay.response.RelayResponse`, to which the watch is handed over): one
watcher task per request waits for ``http.disconnect`` and cancels the await under way
(raising :class:`ClientGone`), so the backend request is closed and a generation aborted
as soon as nobody waits for it. The gateway's drain (:mod:`gateway.relay.drain`) cancels
the set-up the same way at its deadline (:meth:`DisconnectWatch.shut_down`, raising
:class:`ShuttingDown`); a stream's body it ends itself. The guarded work runs in the
request's own task, as ``asyncio.timeout`` runs it: no task per await.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.types import Receive

from gateway.relay.interruptible import Interruptible

T = TypeVar("T")


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class ClientGone(Exception):
    """The client disconnected before the response started (or before its body ended)."""


class ShuttingDown(Exception):
    """The gateway's drain ran out before the response started."""


class DisconnectWatch:
    """``await watch.run(coro)``: ``coro``'s result, or ClientGone once the client left.

    :meth:`close` must be awaited before anything else reads the request's messages, and
    once the request is answered.
    """

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._watcher: asyncio.Task[None] | None = None
        self._gone = False
        self._shut_down = False
        self._guarded = Interruptible()  # the await of guarded work under way

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._gone or self._shut_down:
            coro.close()
            raise ClientGone if self._gone else ShuttingDown
        task = asyncio.current_task()
        assert task is not None
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(self._watch())
        self._guarded.enter(task)
        try:
            return await coro
        except asyncio.CancelledError:
            if self._guarded.caught():
                raise ClientGone if self._gone else ShuttingDown from None
            raise
        finally:
            self._guarded.leave()

    def shut_down(self) -> None:
        """The gateway's drain ran out: the await under way (and any later) raises
        :class:`ShuttingDown`."""
        self._shut_down = True
        self._guarded.interrupt()

    async def close(self) -> None:
        """Stop watching (idempotent)."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    async def _watch(self) -> None:
        await _wait_disconnect(self._receive)
        self._gone = True
        self._guarded.interrupt()
