"""The transport under the gateway's shared ``httpx.AsyncClient``: aiohttp's connections.

The gateway talks to its backends through one ``httpx.AsyncClient``; what carries the
bytes is :class:`UpstreamTransport`, httpx-aiohttp's transport (aiohttp's connection
pool and its C HTTP/1.1 parser), one per backend origin. httpx's own transport parses
every chunk of a streamed reply in pure Python (h11) and hands it up through half a
dozen async generators; a relay reads once per token, and that path was most of the
gateway's CPU per chunk. With aiohttp a read returns everything the socket has
buffered, so under load several events cross the relay at once. Measured side by side
on the gateway's load benchmark (docs/benchmarks.md, "Gateway cost").

What this module adds to httpx-aiohttp is the error contract the relay relies on: every
failure comes out as the precise ``httpx`` exception (a refused connection is
``ConnectError``, a closed one ``RemoteProtocolError``, a connect timeout
``ConnectTimeout``), never as a bare aiohttp exception.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

# aiohttp's exceptions, most specific first, and the httpx exception each becomes.
_ERRORS: tuple[tuple[type[BaseException], type[httpx.TransportError]], ...] = (
    (aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout),
    (aiohttp.ServerTimeoutError, httpx.ReadTimeout),
    (TimeoutError, httpx.PoolTimeout),  # aiohttp's total connect budget, pool wait included
    (aiohttp.ClientConnectorError, httpx.ConnectError),
    (aiohttp.ServerDisconnectedError, httpx.RemoteProtocolError),
    (aiohttp.ClientPayloadError, httpx.ReadError),
    (aiohttp.ClientOSError, httpx.ReadError),
    (aiohttp.ClientError, httpx.RemoteProtocolError),  # a malformed response, and the rest
)


def as_httpx_error(exc: BaseException, request: httpx.Request) -> httpx.TransportError | None:
    """The httpx exception for an aiohttp failure (or for httpx-aiohttp's mapping of one)."""
    cause = exc.__cause__ if isinstance(exc, httpx.TransportError) else exc
    if cause is None:
        return exc if isinstance(exc, httpx.TransportError) else None
    for aio_cls, httpx_cls in _ERRORS:
        if isinstance(cause, aio_cls):
            return httpx_cls(str(cause) or type(cause).__name__, request=request)
    return exc if isinstance(exc, httpx.TransportError) else None


READ_EXTENSION = "tokenpace.read"  # response.extensions key of _Body.read


class _Body(httpx.AsyncByteStream):
    """A response body: what aiohttp has buffered at each read, errors mapped."""

    def __init__(self, stream: httpx.AsyncByteStream, request: httpx.Request) -> None:
        self._stream = stream
        self._parts = stream.__aiter__()
        self._request = request

    async def read(self) -> bytes:
        """The next part of the body (all that is buffered, waiting for some); b"" at EOF."""
        try:
            return await self._parts.__anext__()
        except StopAsyncIteration:
            return b""
        except (httpx.TransportError, aiohttp.ClientError, TimeoutError) as exc:
            mapped = as_httpx_error(exc, self._request)
            if mapped is None:
                raise
            raise mapped from exc

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while part := await self.read():
            yield part

    async def aclose(self) -> None:
        # Releases the connection to the pool after a complete body; closes it otherwise
        # (a stream abandoned half-way: the backend sees the disconnect and aborts).
        await self._stream.aclose()


def body_reader(response: httpx.Response) -> Callable[[], Awaitable[bytes]]:
    """A function returning the next part of a streamed ``response``'s body, b"" at EOF.

    On this module's transport it reads the connection directly, past httpx's layers of
    async iterators (one read per part instead of a chain of generators per part); on
    any other it steps ``response.aiter_bytes()``.
    """
    read = response.extensions.get(READ_EXTENSION)
    if read is not None:
        return read
    parts = response.aiter_bytes()

    async def next_part() -> bytes:
        try:
            return await parts.__anext__()
        except StopAsyncIteration:
            return b""

    return next_part


class UpstreamTransport(AiohttpTransport):
    """httpx-aiohttp's transport with precise httpx errors; one per backend origin."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await super().handle_async_request(request)
        except (httpx.TransportError, aiohttp.ClientError, TimeoutError) as exc:
            mapped = as_httpx_error(exc, request)
            if mapped is None:
                raise
            raise mapped from exc
        assert isinstance(response.stream, httpx.AsyncByteStream)
        body = _Body(response.stream, request)
        response.stream = body
        response.extensions[READ_EXTENSION] = body.read
        return response
