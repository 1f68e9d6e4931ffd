"""The body of a stream answered 200 while it waits in the queue: notices, then the relay.

In ``admission.overload: queue`` mode a streaming request that cannot be admitted at once
is answered at once, and its body starts with queue notices, an SSE comment about once a
second with its place in line and its estimated wait (docs/protocol.md, "Queue notices"):

    : queued position=2 eta_s=3.5

Once admitted, the stream opens on a backend and :class:`~gateway.relay.streaming.
StreamRelay` sends the rest. Anything that ends it before then (the tier's bound:
``overloaded``, the queue's ``queue_timeout``, no backend able to take it) is an OpenAI
error event and ``data: [DONE]``, since the status went out already.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.types import Send

from gateway.admission.controller import Ticket, Waiting
from gateway.errors import GatewayError, sse_error_event
from gateway.relay.streaming import BODY, DONE, StreamRelay


def queue_notice(position: int, wait_s: float) -> bytes:
    """The comment a waiting stream gets (docs/protocol.md, "Queue notices")."""
    return f": queued position={position} eta_s={max(wait_s, 0.0):.1f}\n\n".encode()


class QueuedRelay:
    """Sends a waiting stream's body (module doc): ``start`` opens the stream once
    ``waiting`` is admitted (closing the ticket when it raises), ``on_error`` hears of an
    error that ended the stream before it opened."""

    def __init__(
        self,
        waiting: Waiting,
        start: Callable[[Ticket], Awaitable[StreamRelay]],
        on_error: Callable[[GatewayError], None],
    ) -> None:
        self.waiting = waiting
        self.start = start
        self.on_error = on_error
        self.relay: StreamRelay | None = None

    async def send_body(self, send: Send) -> None:
        async def notify(position: int, wait_s: float) -> None:
            await send({"type": BODY, "body": queue_notice(position, wait_s), "more_body": True})

        try:
            ticket = await self.waiting.ticket(notify)
            self.relay = await self.start(ticket)
        except GatewayError as exc:
            self.on_error(exc)
            end = sse_error_event(exc.body) + DONE
            await send({"type": BODY, "body": end, "more_body": True})
            return
        await self.relay.send_body(send)

    async def finish(self) -> None:
        """For a body that never started, or ended: the relay's teardown, or the place in
        the queue given up."""
        if self.relay is not None:
            await self.relay.finish()
        else:
            await self.waiting.abandon()
