"""The streaming response: SSE headers, and the relay sending its body in a task of its
own, cancelled when the client leaves by the watch that guarded the request's set-up."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.context import server_send
from gateway.relay.disconnect import ClientGone, DisconnectWatch


class Body(Protocol):
    """What sends a streaming response's body: :class:`~gateway.relay.streaming.
    StreamRelay`, or :class:`~gateway.relay.queued.QueuedRelay` for a stream that waits
    first."""

    async def send_body(self, send: Send) -> None:
        """Send the body's messages, each with ``more_body`` (the response sends the last)."""

    async def finish(self) -> Any:
        """Tear down, once; also for a body that never started."""


# sse-starlette's: no cache may keep the stream, no proxy may buffer it
SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


class RelayResponse(Response):
    """``text/event-stream`` whose body :meth:`StreamRelay.send_body
    <gateway.relay.streaming.StreamRelay.send_body>` sends, write by write.

    The body runs in a task of its own, whose only frames are the relay's (every chunk
    resumes each coroutine frame between the task and the backend's read: the request's
    task holds every middleware's), awaited under the request's
    :class:`~gateway.relay.disconnect.DisconnectWatch`, handed over from the set-up it
    guarded: its one watcher task, which waits for ``http.disconnect``, cancels the body
    when the client leaves (the relay's teardown then closes the upstream and returns
    the slot). sse-starlette's response ran the body in an anyio task group of three
    tasks per stream: its body loop, a disconnect listener (a second watcher after the
    set-up's) and a shutdown listener the gateway's drain replaces; the relay sends its
    own pings and ends its own streams at shutdown (:mod:`gateway.relay.drain`). The
    start goes through the middleware stack; the body messages, which every middleware
    passes through unchanged, go straight to the server's ``send``
    (:func:`gateway.context.server_send`).
    """

    media_type = "text/event-stream"

    def __init__(self, relay: Body, headers: dict[str, str], watch: DisconnectWatch) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers({**headers, **SSE_HEADERS})
        self._relay = relay
        self._watch = watch

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            start = {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
            await send(start)
            try:
                # ends with relay.finish(); ClientGone: cancelled, the client left
                await self._watch.run(_in_task(self._relay, server_send(scope) or send))
            except ClientGone:
                return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await self._watch.close()
            await self._relay.finish()  # a body that never started is torn down too


async def _in_task(relay: Body, send: Send) -> None:
    """``relay``'s body in a task of its own; cancelled, the body is cancelled and its
    teardown awaited (awaiting a task does both)."""
    await asyncio.ensure_future(relay.send_body(send))
