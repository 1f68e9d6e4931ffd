"""An httpcore network backend on asyncio's own streams, for the upstream connections.

httpx reaches the network through httpcore's pluggable network backend; its default on
asyncio goes through anyio, which for every read of a streamed reply creates and enters
a cancel scope, looks up the running async library, and resumes then pauses the socket's
reading (two event-loop registrations per read). A relay reads once per token, and at
256 streams that overhead was what saturated the gateway (bench/gateway_load.py,
docs/benchmarks.md). This backend
implements the same interface (httpcore.AsyncNetworkBackend) on asyncio.StreamReader and
StreamWriter: a read returns what the socket has buffered, or waits for it; a timeout is
armed only when one is given (the relay keeps its own deadlines and passes none).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore

SocketOption = tuple[Any, ...]  # the (level, option, value) of socket.setsockopt

_READ_LIMIT = 2**20  # bytes a connection buffers before it stops reading the socket


def _httpcore_error(
    exc: OSError, timeout_exc: type[Exception], error_exc: type[Exception]
) -> Exception:
    """An asyncio timeout or socket error as the httpcore exception that httpx maps.

    (TimeoutError is an OSError; ssl.SSLError and ConnectionError are too.)
    """
    cls = timeout_exc if isinstance(exc, TimeoutError) else error_exc
    return cls(str(exc) or type(exc).__name__)


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One connection: httpcore's stream interface over asyncio's reader and writer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            if timeout is None:  # no timer armed: the relay keeps its own deadlines
                return await self._reader.read(max_bytes)
            async with asyncio.timeout(timeout):
                return await self._reader.read(max_bytes)
        except OSError as exc:
            raise _httpcore_error(exc, httpcore.ReadTimeout, httpcore.ReadError) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            self._writer.write(buffer)
            async with asyncio.timeout(timeout):
                await self._writer.drain()
        except OSError as exc:
            raise _httpcore_error(exc, httpcore.WriteTimeout, httpcore.WriteError) from exc

    async def aclose(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):  # already reset by the peer: closed either way
            await self._writer.wait_closed()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                await self._writer.start_tls(ssl_context, server_hostname=server_hostname)
        except OSError as exc:
            raise _httpcore_error(exc, httpcore.ConnectTimeout, httpcore.ConnectError) from exc
        return self

    def get_extra_info(self, info: str) -> Any:
        if info == "ssl_object":
            return self._writer.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._writer.get_extra_info("sockname")
        if info == "server_addr":
            return self._writer.get_extra_info("peername")
        if info == "socket":
            return self._writer.get_extra_info("socket")
        if info == "is_readable":
            # httpcore asks this of an idle pooled connection: readable means the server
            # sent something or closed it, so it must not be reused.
            reader = self._reader
            return reader.at_eof() or reader.exception() is not None or self._writer.is_closing()
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend on asyncio streams, for TCP (the gateway's backends)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        local_addr = None if local_address is None else (local_address, 0)
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    host, port, local_addr=local_addr, limit=_READ_LIMIT
                )
        except OSError as exc:
            raise _httpcore_error(exc, httpcore.ConnectTimeout, httpcore.ConnectError) from exc
        sock: socket.socket = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for option in socket_options or ():
            sock.setsockopt(*option)
        return AsyncioStream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
