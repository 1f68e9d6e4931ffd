"""The HTTP server the gateway runs under: uvicorn, with limits on what a connection costs.

uvicorn's httptools protocol (what ``uvicorn[standard]`` runs) has no limit on the size
of request headers and no timeout on reading them or the body: its keep-alive timeout
stops at a request's first byte. A client sending one byte every few seconds held its
connection (and its file descriptor) for ever, and a 50 MB header was buffered whole.
:class:`GuardedHttpToolsProtocol` adds, per connection:

- a header limit (``limits.max_header_bytes``): request line and headers past it get
  ``431`` and the connection is closed; bytes are counted as they arrive, so an
  unfinished header never holds more than the limit plus one socket read;
- a header-read timeout (``server.header_timeout_s``): from the connection (or the first
  byte of a later request on it) to the last header; past it ``408`` and close;
- a body-read timeout (``server.body_timeout_s``): from the last header to the body's
  last byte; past it ``408`` (if no response has started) and close;
- a write timeout (``server.write_timeout_s``): a client that stops reading fills the
  connection's buffers until uvicorn pauses the response's writes; once they have stayed
  paused that long the connection is aborted (its unsent bytes dropped), so the app's
  ``receive()`` says ``http.disconnect`` and the stream ends, giving back its admission
  slot. The timer runs only while writes are paused: nothing is added per chunk;
- a cap on open connections (``server.max_connections``): a connection over the cap is
  answered ``503`` (``Retry-After: 1``, code ``server_busy``) at once, without reading
  its request, and closed; the connections already open are not disturbed;
- HTTP/1.0 as RFC 9112 has it: a response of unknown length (a stream) is delimited by
  the connection's close, never chunked (§6.1: no ``Transfer-Encoding`` unless the
  request is HTTP/1.1), with the server's ``Connection: close`` as its only
  ``Connection`` header;
- a drain when the server stops (SIGTERM): uvicorn closes the listening sockets and asks
  each open connection to shut down, and the first one to be asked begins the app's
  :class:`~gateway.relay.drain.Drain` (found in the app's lifespan state); uvicorn waits
  for the connections for ``server.drain_s`` plus :data:`~gateway.relay.drain.EXIT_S`.

Every answer is OpenAI-shaped. The subclass relies on uvicorn's protocol internals, so
uvicorn is pinned in pyproject.toml. :func:`uvicorn_config` is how ``tokenpace serve``
and the tests build the server.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import math
import socket
from typing import Any

import uvicorn
from starlette.types import Message, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from gateway.config.schema import GatewayConfig
from gateway.errors import SERVER_ERROR, error_body
from gateway.relay.drain import DRAIN_STATE_KEY, EXIT_S, Drain

log = logging.getLogger("tokenpace.gateway.server")

LINGER_S = 1.0  # a closed connection drops what the client still sends this long
_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


def raw_response(status: int, reason: bytes, body: dict[str, Any], extra: bytes = b"") -> bytes:
    """A complete ``Connection: close`` HTTP/1.1 response with a JSON body."""
    payload = json.dumps(body).encode()
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n%s\r\n" % (status, reason, len(payload), extra)
    ) + payload


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of the module docstring."""

    max_header_bytes = 32 * 1024
    header_timeout_s = 10.0
    body_timeout_s = 30.0
    write_timeout_s = 30.0
    max_connections = 4096

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refused = False  # over the cap: answered 503 at connection time
        self._closed = False  # closed by a limit: nothing more is parsed or answered
        self._reading_headers = True
        self._body_pending = False  # headers read, the body's last byte not yet
        self._header_bytes = 0
        # The header or body deadline (loop time), and which; one timer, moved lazily
        # (:meth:`_arm`)
        self._deadline: float | None = None
        self._deadline_of = "headers"
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._write_timer: asyncio.TimerHandle | None = None  # while writes are paused
        self._linger: asyncio.TimerHandle | None = None

    # -- connections ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.max_connections:
            self._refused = True
            self.transport = transport
            body = error_body(
                "The gateway has too many open connections; retry shortly.",
                type=SERVER_ERROR,
                code="server_busy",
            )
            log.warning("connection refused: %d connections open", len(self.connections))
            self._end(raw_response(503, b"Service Unavailable", body, b"retry-after: 1\r\n"))
            return
        super().connection_made(transport)
        self._arm(self.header_timeout_s, "headers")

    def connection_lost(self, exc: Exception | None) -> None:
        if self._linger is not None:
            self._linger.cancel()
        self._disarm()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._writable()
        if not self._refused:
            super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused or self._closed:
            return  # lingering: dropped
        if self._reading_headers:
            self._header_bytes += len(data)
        super().data_received(data)
        # Still in the headers after this read: the bytes so far are all header bytes.
        closing = self.transport.is_closing()  # uvicorn answered 400 (unparseable)
        if self._reading_headers and self._header_bytes > self.max_header_bytes and not closing:
            self._too_large()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.write_timeout_s, self._not_reading)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._writable()

    def _writable(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _not_reading(self) -> None:
        """Writes stayed paused for ``write_timeout_s``: the client stopped reading. The
        connection is aborted (a close would wait for the unread bytes to go out)."""
        self._write_timer = None
        if self._closed or self.transport.is_closing():
            return
        log.info(
            "client read nothing for %g s: connection %s aborted",
            self.write_timeout_s,
            self.client,
        )
        self._closed = True
        self._disarm()
        self.transport.abort()  # connection_lost: the app sees http.disconnect

    # -- parser callbacks -----------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:
            self._arm(self.header_timeout_s, "headers")

    def on_headers_complete(self) -> None:
        if self._closed:
            return
        self._reading_headers = False
        size = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
        if size > self.max_header_bytes:
            self._too_large()
            return
        self._arm(self.body_timeout_s, "body")
        self._body_pending = True
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._closed:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._closed:
            return
        self._disarm()
        self._body_pending = False
        self._reading_headers = True  # the next request on this connection
        self._header_bytes = 0
        super().on_message_complete()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        if cycle.scope["http_version"] == "1.0":
            cycle.send = close_delimited(cycle)  # type: ignore[method-assign,assignment]
        super()._start_asgi_task(cycle, app)

    def shutdown(self) -> None:
        drain = self.app_state.get(DRAIN_STATE_KEY)
        if isinstance(drain, Drain):
            drain.begin()
        super().shutdown()

    def on_response_complete(self) -> None:
        if self._body_pending and not self._closed:
            # answered before its body was read (a refusal: 401, 413): the rest of the
            # body is not waited for, the connection ends
            self.server_state.total_requests += 1
            self._end(b"")
            return
        super().on_response_complete()

    # -- the limits -----------------------------------------------------------------------
    def _arm(self, seconds: float, what: str) -> None:
        """``what`` is due within ``seconds``. One timer per connection fires no later
        than the deadline and, when it fires early (the deadline moved on since it was
        armed: a later request on the connection), re-arms itself once for the new one:
        a request arms and cancels no timer of its own, as the relay's reads do not
        (:mod:`gateway.relay.read_deadline`)."""
        self._deadline = self.loop.time() + seconds
        self._deadline_of = what
        if self._timer is None or self._timer_at > self._deadline:
            self._set_timer(self._deadline)

    def _disarm(self) -> None:
        self._deadline = None  # the timer, if it fires, finds nothing due

    def _set_timer(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self.loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if self._deadline is None:  # nothing due: the next deadline arms the timer again
            return
        if self.loop.time() < self._deadline:  # the deadline moved since it was armed
            self._set_timer(self._deadline)
            return
        self._deadline = None
        self._timed_out(self._deadline_of)

    def _timed_out(self, what: str) -> None:
        if self._closed or self.transport.is_closing():
            return
        seconds = self.header_timeout_s if what == "headers" else self.body_timeout_s
        started = self.cycle is not None and self.cycle.response_started
        silent = what == "headers" and self._header_bytes == 0  # nothing sent: just close
        if started or silent:
            self._end(b"")
            return
        body = error_body(
            f"The request's {what} did not arrive within {seconds:g} s.", code="request_timeout"
        )
        self._end(raw_response(408, _REASONS[408], body))

    def _too_large(self) -> None:
        body = error_body(
            f"Request headers too large: the limit is {self.max_header_bytes} bytes.",
            code="headers_too_large",
        )
        self._end(raw_response(431, _REASONS[431], body))

    def _end(self, answer: bytes) -> None:
        """Answer (if anything), then close: nothing more is parsed or answered.

        A lingering close, as HTTP servers do: the write side is shut at once (the client
        reads the answer, then end of stream), what the client still sends is read and
        dropped for :data:`LINGER_S`, then the socket closes. Closing at once, with the
        client's bytes unread, makes the kernel reset the connection, and the client may
        lose the answer.
        """
        self._closed = True
        self._disarm()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the app's receive() gets http.disconnect
            self.cycle.message_event.set()
        self.connections.discard(self)
        transport = self.transport
        if answer:
            transport.write(answer)
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        transport.resume_reading()  # flow control may have paused it: read and drop
        self._linger = self.loop.call_later(LINGER_S, transport.close)


def close_delimited(cycle: RequestResponseCycle) -> Send:
    """``cycle.send`` for an HTTP/1.0 request (uvicorn would chunk a body of unknown
    length and keep the app's ``Connection`` header next to its own ``close``).

    A response without ``Content-Length`` goes out as it comes, its end the connection's
    close (RFC 9112 §6.3), which uvicorn does after it for HTTP/1.0 anyway; the app's
    ``Connection`` and ``Transfer-Encoding`` headers are dropped (hop-by-hop: the
    server's), so ``Connection: close`` is the only one.
    """
    send: Any = cycle.send  # uvicorn's, typed with its own message types
    unsized = False

    async def send_http10(message: Message) -> None:
        nonlocal unsized
        if message["type"] == "http.response.start":
            headers = [
                (name, value)
                for name, value in message.get("headers", [])
                if name.lower() not in (b"connection", b"transfer-encoding")
            ]
            message = {**message, "headers": headers}
            if not any(name.lower() == b"content-length" for name, _ in headers):
                unsized = True
                cycle.chunked_encoding = False  # uvicorn adds no Transfer-Encoding
        elif unsized and message["type"] == "http.response.body":
            # uvicorn checks each write against a remaining length: this write's, and
            # one byte more while more comes (the close ends the body, not a count)
            more = message.get("more_body", False)
            cycle.expected_content_length = len(message.get("body", b"")) + int(more)
        await send(message)

    return send_http10


def protocol_for(config: GatewayConfig) -> type[GuardedHttpToolsProtocol]:
    """:class:`GuardedHttpToolsProtocol` with ``config``'s limits."""
    s = config.server
    attrs = {
        "max_header_bytes": config.limits.max_header_bytes,
        "header_timeout_s": s.header_timeout_s,
        "body_timeout_s": s.body_timeout_s,
        "write_timeout_s": s.write_timeout_s,
        "max_connections": s.max_connections,
    }
    return type("GatewayHttpProtocol", (GuardedHttpToolsProtocol,), attrs)


def graceful_shutdown_s(config: GatewayConfig) -> int:
    """How long uvicorn waits for open connections when it stops: the drain, then the
    last writes and the app's shutdown."""
    return math.ceil(config.server.drain_s + EXIT_S)


def uvicorn_config(app: Any, config: GatewayConfig, **kwargs: Any) -> uvicorn.Config:
    """The uvicorn configuration of a gateway serving ``app`` (``kwargs`` pass through)."""
    kwargs.setdefault("timeout_graceful_shutdown", graceful_shutdown_s(config))
    return uvicorn.Config(
        app,
        http=protocol_for(config),
        ws="none",
        lifespan="on",
        access_log=False,
        **kwargs,
    )


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port`` 0: a free one), as uvicorn binds.

    ``IPPROTO_TCP``, so that asyncio sets ``TCP_NODELAY`` on the accepted connections.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


YOUNG_GENERATION_ALLOCATIONS = 10_000
"""Allocations between two collections of the cyclic garbage collector's youngest
generation (CPython's default is 700). A request makes a few thousand; at 700 the young
generations were collected many times during each one, and whatever the requests in
flight held then was promoted to the oldest generation as if long-lived. The oldest was
then collected every few hundred requests, each time walking every object the gateway
keeps (the requests and records it remembers): 0.1-0.2 s a full collection once
100,000 requests were remembered. At 10,000 the oldest generation is collected about
thirty times less often, and a request costs 0.13 ms (11 %) less CPU there
(docs/benchmarks.md, "Gateway cost"); what waits longer for collection is cyclic
garbage only, a few megabytes at most."""


def tune_garbage_collector() -> None:
    """Move everything built at start-up out of the cyclic garbage collector's sight, and
    collect the young generation every YOUNG_GENERATION_ALLOCATIONS allocations.

    The imported libraries and the app are hundreds of thousands of long-lived objects;
    every full collection walked them all again, which under streaming load (many short-lived
    objects per chunk) cost the gateway about 15 % of its CPU. ``gc.freeze()`` after one
    collection is the CPython-documented remedy for long-running servers.
    """
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GENERATION_ALLOCATIONS, middle, oldest)
