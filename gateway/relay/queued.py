"""The body of a stream answered 200 while it waits in the queue: notices, then the relay.

In ``admission.overload: queue`` mode a streaming request that cannot be admitted at once
is answered at once, and its body starts with queue notices, an SSE comment about once a
second with its place in line and its estimated wait (docs/protocol.md, "Queue notices"):

    : queued position=2 eta_s=3.5

Once admitted, the stream opens on a backend and :class:`~gateway.relay.streaming.
StreamRelay` sends the rest. Anything that ends it before then (the tier's bound:
``overloaded``, the queue's ``queue_timeout``, no backend able to take it) is an OpenAI
error event and ``data: [DONE]``, since the status went out already; so is the
gateway's drain running out while it waits (``server_shutting_down``,
:mod:`gateway.relay.drain`). A reader who left while it waits (a ``left`` signal,
:mod:`gateway.relay.reader`) gives its place up: the stream ends with ``data: [DONE]``
alone, as the relay ends one whose reader left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from starlette.types import Send

from gateway.admission.controller import Notify, Ticket, Waiting
from gateway.errors import GatewayError, sse_error_event
from gateway.relay.drain import Drain, shutting_down
from gateway.relay.interruptible import Interruptible
from gateway.relay.reader import ReaderChannel
from gateway.relay.streaming import BODY, DONE, StreamRelay
from qos.signals import Presence, ReaderSignal


def queue_notice(position: int, wait_s: float) -> bytes:
    """The comment a waiting stream gets (docs/protocol.md, "Queue notices")."""
    return f": queued position={position} eta_s={max(wait_s, 0.0):.1f}\n\n".encode()


class _ReaderLeft(Exception):
    """The reader left while the stream waited."""


class QueuedRelay:
    """Sends a waiting stream's body (module doc): ``start`` opens the stream once
    ``waiting`` is admitted (closing the ticket when it raises), ``on_error`` hears of an
    error that ended the stream before it opened, ``on_left`` of its reader leaving
    before it opened (``readers``' ``left`` signal); the wait is also ``drain``'s to end."""

    def __init__(
        self,
        waiting: Waiting,
        start: Callable[[Ticket], Awaitable[StreamRelay]],
        on_error: Callable[[GatewayError], None],
        on_left: Callable[[], None],
        drain: Drain,
        readers: ReaderChannel,
    ) -> None:
        self.waiting = waiting
        self.start = start
        self.on_error = on_error
        self.on_left = on_left
        self.drain = drain
        self.readers = readers
        self.relay: StreamRelay | None = None
        self._shut_down = False
        self._left = False
        self._wait = Interruptible()  # the wait for admission, which the drain ends

    async def send_body(self, send: Send) -> None:
        async def notify(position: int, wait_s: float) -> None:
            await send({"type": BODY, "body": queue_notice(position, wait_s), "more_body": True})

        request_id = self.waiting.request_id
        try:
            self.drain.add(self)
            self.readers.add(request_id, self, 0.0)  # no engine asked yet
            try:
                ticket = await self._admitted(notify)
            finally:
                self.readers.discard(request_id)
                self.drain.discard(self)
            self.relay = await self.start(ticket)
        except GatewayError as exc:
            self.on_error(exc)
            end = sse_error_event(exc.body) + DONE
            await send({"type": BODY, "body": end, "more_body": True})
            return
        except _ReaderLeft:  # its place given up
            self.on_left()
            await send({"type": BODY, "body": DONE, "more_body": True})
            return
        await self.relay.send_body(send)

    def shut_down(self) -> None:
        """The drain ran out: the wait ends with ``server_shutting_down``."""
        self._shut_down = True
        self._wait.interrupt()

    def reader_signal(self, signal: ReaderSignal) -> None:
        """``left``: the wait ends and the place in the queue is given up; the other
        signals are for the engine, which has nothing of this request yet."""
        if signal.presence is Presence.LEFT:
            self._left = True
            self._wait.interrupt()

    async def _admitted(self, notify: Notify) -> Ticket:
        if self._shut_down or self._left:
            await self.waiting.abandon()
            raise shutting_down() if self._shut_down else _ReaderLeft()
        task = asyncio.current_task()
        assert task is not None
        self._wait.enter(task)
        try:
            return await self.waiting.ticket(notify)  # gives up its place when cancelled
        except asyncio.CancelledError:
            if self._wait.caught():
                raise shutting_down() if self._shut_down else _ReaderLeft() from None
            raise
        finally:
            self._wait.leave()

    async def finish(self) -> None:
        """For a body that never started, or ended: the relay's teardown, or the place in
        the queue given up."""
        if self.relay is not None:
            await self.relay.finish()
        else:
            await self.waiting.abandon()
