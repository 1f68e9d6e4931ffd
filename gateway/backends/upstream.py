"""The transport under the gateway's shared ``httpx.AsyncClient``: aiohttp's connections.

The gateway talks to its backends through one ``httpx.AsyncClient``; what carries the
bytes is :class:`UpstreamTransport`, httpx's transport interface on an aiohttp session
(aiohttp's connection pool and its C HTTP/1.1 parser), one per backend origin. httpx's
own transport parses every chunk of a streamed reply in pure Python (h11) and hands it
up through half a dozen async generators; a relay reads once per token, and that path
was most of the gateway's CPU per chunk. On aiohttp the chunked encoding is taken apart
in the socket callback, and a read returns everything buffered, so under load several
events cross the relay at once (docs/benchmarks.md, "Gateway cost").

The relay reads a body with :func:`body_reader`, which on this transport is aiohttp's
``readany()``: cancel-safe (a read cancelled while waiting loses nothing; the relay's
deadlines rely on that) and past httpx's layers of iterators. Every failure comes out
as the precise ``httpx`` exception (a refused connection is ``ConnectError``, a closed
one ``RemoteProtocolError``, a connect timeout ``ConnectTimeout``), never as an aiohttp
one. (httpx-aiohttp, the published glue, maps a refused connection to a timeout and
reads bodies through an async generator that a cancelled read would end.)
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import httpx

from gateway.backends.cancel_safe import ShieldedSteps

READ_EXTENSION = "tokenpace.read"  # response.extensions key of the body's read function

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


def as_httpx_error(exc: BaseException, request: httpx.Request) -> httpx.TransportError:
    """The httpx exception for an aiohttp failure (``exc`` is aiohttp's or a timeout)."""
    for aio_cls, httpx_cls in _ERRORS:
        if isinstance(exc, aio_cls):
            return httpx_cls(str(exc) or type(exc).__name__, request=request)
    return httpx.TransportError(str(exc) or type(exc).__name__, request=request)


class _Body(httpx.AsyncByteStream):
    """A response body read from aiohttp's buffer, errors mapped."""

    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request

    async def read(self) -> bytes:
        """All the body that is buffered, waiting for some; b"" at the end. Cancel-safe."""
        try:
            return await self._response.content.readany()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise as_httpx_error(exc, self._request) from exc

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while part := await self.read():
            yield part

    async def aclose(self) -> None:
        # The connection goes back to the pool after a complete body and is closed
        # otherwise (a stream abandoned half-way: the backend sees the disconnect and
        # aborts the generation).
        self._response.release()


class UpstreamTransport(httpx.AsyncBaseTransport):
    """httpx's transport on one aiohttp session: a pool of ``max_connections``."""

    def __init__(
        self,
        *,
        max_connections: int,
        keepalive_expiry: float,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self._max_connections = max_connections
        self._keepalive_expiry = keepalive_expiry
        self._verify = verify
        self._session: aiohttp.ClientSession | None = None  # made in the loop, on first use

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections,
                keepalive_timeout=self._keepalive_expiry,
                ssl=self._verify,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,  # bytes are relayed as they come
                cookie_jar=aiohttp.DummyCookieJar(),  # a backend's cookies mean nothing here
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout", {})
        try:
            data: bytes | httpx.AsyncByteStream | None = request.content or None
        except httpx.RequestNotRead:  # a streamed upload: aiohttp sends it chunked
            data = request.stream  # type: ignore[assignment]
            request.headers.pop("transfer-encoding", None)
        try:
            response = await self._get_session().request(
                request.method,
                str(request.url),
                headers=request.headers.multi_items(),
                data=data,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(
                    sock_connect=timeout.get("connect"),
                    sock_read=timeout.get("read"),
                    connect=timeout.get("pool"),
                ),
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise as_httpx_error(exc, request) from exc
        body = _Body(response, request)
        return httpx.Response(
            status_code=response.status,
            headers=response.raw_headers,
            stream=body,
            request=request,
            extensions={"http_version": b"HTTP/1.1", READ_EXTENSION: body.read},
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def body_reader(response: httpx.Response) -> Callable[[], Awaitable[bytes]]:
    """A cancel-safe function returning the next part of a streamed ``response``'s body,
    b"" at the end.

    On :class:`UpstreamTransport` it is the connection's own read, past httpx's layers
    of async iterators; on any other transport it steps ``response.aiter_bytes()`` in
    shielded tasks (:class:`~gateway.backends.cancel_safe.ShieldedSteps`).
    """
    read = response.extensions.get(READ_EXTENSION)
    if read is not None:
        return read
    steps = ShieldedSteps(response.aiter_bytes())

    async def next_part() -> bytes:
        try:
            return await steps.next()
        except StopAsyncIteration:
            return b""

    return next_part
