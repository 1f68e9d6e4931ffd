"""The streaming response: sse-starlette's, with the relay sending its body."""

from __future__ import annotations

from typing import Any, Protocol

import anyio
from sse_starlette.sse import EventSourceResponse
from starlette.background import BackgroundTask
from starlette.types import Receive, Scope, Send

from gateway.context import server_send


class Body(Protocol):
    """What sends a streaming response's body: :class:`~gateway.relay.streaming.
    StreamRelay`, or :class:`~gateway.relay.queued.QueuedRelay` for a stream that waits
    first."""

    async def send_body(self, send: Send) -> None:
        """Send the body's messages, each with ``more_body`` (the response sends the last)."""

    async def finish(self) -> Any:
        """Tear down, once; also for a body that never started."""


class RelayResponse(EventSourceResponse):
    """sse-starlette's response (its disconnect and shutdown listeners, its headers) with
    the relay's own body loop: :meth:`StreamRelay.send_body
    <gateway.relay.streaming.StreamRelay.send_body>` sends every write itself.

    sse-starlette's loop steps an async generator and wraps each send in
    ``anyio.move_on_after(send_timeout)``, even without a timeout; on a relay that sends
    thousands of chunks a second, those layers were a measurable share of the gateway's
    CPU per chunk (docs/benchmarks.md). The start goes through the middleware stack; the
    body messages, which every middleware passes through unchanged, go straight to the
    server's ``send`` (:func:`gateway.context.server_send`). This overrides
    sse-starlette's private ``_stream_response`` and its shutdown listener (pinned in
    pyproject.toml to the version it was tested with;
    tests/gateway/test_dependency_interfaces.py).
    """

    def __init__(self, relay: Body, headers: dict[str, str]) -> None:
        super().__init__(
            iter(()),  # never iterated: the relay sends the body
            headers=headers,
            ping=0,  # the relay sends its own pings, only while it waits
            sep="\n",
            background=BackgroundTask(relay.finish),  # for a body that never started
        )
        # hop-by-hop, the server's to say (sse-starlette's "keep-alive" next to the
        # server's "close" contradicted it, for HTTP/1.0 and when draining)
        del self.headers["connection"]
        self._relay = relay
        self._body_send: Send | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._body_send = server_send(scope)
        await super().__call__(scope, receive, send)

    async def _listen_for_exit_signal_with_grace(self) -> None:
        """Never: sse-starlette's shutdown listener cut every stream as soon as the server
        was told to stop; the gateway's drain ends them (:mod:`gateway.relay.drain`)."""
        await anyio.sleep_forever()

    async def _stream_response(self, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        await self._relay.send_body(self._body_send or send)  # ends with relay.finish()
        async with self._send_lock:
            self.active = False
            await send({"type": "http.response.body", "body": b"", "more_body": False})
