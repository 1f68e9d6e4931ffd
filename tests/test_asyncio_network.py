"""gateway.asyncio_network: httpcore's network interface on asyncio streams.

Every gateway test that reaches an upstream goes through this backend; these tests pin
what the relay relies on, against real sockets: the shared client really uses it, a
streamed body arrives piece by piece as the server writes it, pooled connections are
reused and an idle one the server closed is not, errors and timeouts come out as
httpx's exceptions, and TLS works (with a certificate made by the openssl command).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpcore
import httpx
import pytest

from gateway.asyncio_network import AsyncioBackend
from gateway.backends import ShardedTransport

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bool:
    """Read one request head (the tests send bodiless GETs); False at EOF."""
    try:
        await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return False
    return True


@contextlib.asynccontextmanager
async def serve(handler: Handler, ssl_ctx: ssl.SSLContext | None = None) -> AsyncIterator[int]:
    """A raw asyncio HTTP/1.1 server on a free loopback port; yields the port."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=ssl_ctx)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2)


def keepalive_handler(body: bytes = b"ok", idle_close_s: float | None = None) -> Handler:
    """Answer every request on a connection; close it after ``idle_close_s`` idle."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    async with asyncio.timeout(idle_close_s):
                        if not await _read_request(reader):
                            return
                except TimeoutError:
                    return  # idle too long: close, as uvicorn's keep-alive timeout does
                head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n\r\n"
                writer.write(head.encode() + body)
                await writer.drain()
        finally:
            writer.close()

    return handle


def sharded_client(timeout: float = 5.0) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=4, max_keepalive_connections=4, keepalive_expiry=30)
    return httpx.AsyncClient(transport=ShardedTransport(limits), timeout=timeout)


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every AsyncioBackend.connect_tcp call, recorded."""
    seen: list[tuple[str, int]] = []
    original = AsyncioBackend.connect_tcp

    async def recording(self: AsyncioBackend, host: str, port: int, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append((host, port))
        return await original(self, host, port, *args, **kwargs)

    monkeypatch.setattr(AsyncioBackend, "connect_tcp", recording)
    return seen


async def test_gateway_transport_uses_it_and_reuses_connections(connects) -> None:
    async with serve(keepalive_handler()) as port, sharded_client() as client:
        for _ in range(3):
            r = await client.get(f"http://127.0.0.1:{port}/")
            assert r.status_code == 200 and r.content == b"ok"
    assert connects == [("127.0.0.1", port)]  # one connection, through this backend


async def test_idle_connection_closed_by_server_is_not_reused(connects) -> None:
    async with serve(keepalive_handler(idle_close_s=0.1)) as port, sharded_client() as client:
        assert (await client.get(f"http://127.0.0.1:{port}/")).status_code == 200
        await asyncio.sleep(0.3)  # the server has closed the idle connection by now
        assert (await client.get(f"http://127.0.0.1:{port}/")).status_code == 200
    assert len(connects) == 2


async def test_streamed_body_arrives_as_the_server_writes_it() -> None:
    release = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await release.wait()  # the second piece only after the client saw the first
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
        await writer.drain()
        writer.close()

    pieces = []
    async with (
        serve(handle) as port,
        sharded_client() as client,
        client.stream("GET", f"http://127.0.0.1:{port}/") as r,
    ):
        async for piece in r.aiter_raw():
            pieces.append(piece)
            release.set()
    assert pieces == [b"first", b"second"]


async def test_connect_refused_is_httpx_connect_error() -> None:
    async with serve(keepalive_handler()) as port:
        pass  # the port is free again
    async with sharded_client() as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{port}/")


async def test_read_timeout_and_peer_reset_are_httpx_errors() -> None:
    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(5)
        writer.close()

    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await writer.drain()
        writer.transport.abort()  # RST mid-body

    async with serve(hang) as port, sharded_client(timeout=0.2) as client:
        t0 = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            await client.get(f"http://127.0.0.1:{port}/")
        assert time.monotonic() - t0 < 2
    async with serve(reset) as port, sharded_client() as client:
        with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
            await client.get(f"http://127.0.0.1:{port}/")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_tls(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    openssl = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    subject = ["-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"]
    files = ["-keyout", str(key), "-out", str(cert)]
    subprocess.run([*openssl, *subject, *files], check=True, capture_output=True)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(cert))
    async with (
        serve(keepalive_handler(b"secret"), ssl_ctx=server_ctx) as port,
        httpcore.AsyncConnectionPool(
            ssl_context=client_ctx, network_backend=AsyncioBackend()
        ) as pool,
    ):
        for _ in range(2):
            r = await pool.request("GET", f"https://localhost:{port}/")
            assert r.status == 200 and r.content == b"secret"
        [conn] = pool.connections  # reused over TLS
        assert conn.is_idle()
