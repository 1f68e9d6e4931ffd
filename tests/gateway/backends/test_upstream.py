"""gateway.backends.upstream: the shared client's transport (aiohttp under httpx), on real sockets.

What the relay relies on: the client built by ``build_http_client`` reuses pooled
connections and drops one the server closed while idle; a streamed body arrives piece
by piece as the server writes it, and several pieces already buffered come in one read;
a read cancelled while waiting loses nothing; abandoning a body half-way closes the
connection (so vLLM aborts the generation); every
failure is an ``httpx`` exception of the right kind, never an aiohttp one; TLS works
(a certificate made by the openssl command).
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

import httpx
import pytest

from gateway.backends.http import build_http_client
from gateway.backends.upstream import UpstreamTransport, body_reader
from gateway.config.schema import GatewayConfig

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """A raw asyncio HTTP/1.1 server on a free loopback port, counting connections."""

    def __init__(self) -> None:
        self.port = 0
        self.connections = 0
        self.closed = asyncio.Event()  # a connection's client went away


async def _read_request(reader: asyncio.StreamReader) -> bool:
    """Read one request head and its body (Content-Length); False at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return False
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":")[1]))
    return True


@contextlib.asynccontextmanager
async def serve(handler: Handler, ssl_ctx: ssl.SSLContext | None = None) -> AsyncIterator[Server]:
    state = Server()

    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.connections += 1
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(counted, "127.0.0.1", 0, ssl=ssl_ctx)
    state.port = server.sockets[0].getsockname()[1]
    try:
        yield state
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2)


def keepalive_handler(body: bytes = b"ok", idle_close_s: float | None = None) -> Handler:
    """Answer every request on a connection; close it after ``idle_close_s`` idle."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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

    return handle


def gateway_client(port: int) -> httpx.AsyncClient:
    """The client the gateway builds for one backend on ``port``."""
    config = GatewayConfig.model_validate(
        {
            "tenants": [{"name": "t", "api_keys": [{"key": "k" * 16}]}],
            "backends": [{"name": "b", "url": f"http://127.0.0.1:{port}/v1", "models": ["*"]}],
        }
    )
    return build_http_client(config)


async def test_pooled_connections_are_reused() -> None:
    async with serve(keepalive_handler()) as srv, gateway_client(srv.port) as client:
        for _ in range(3):
            r = await client.get(f"http://127.0.0.1:{srv.port}/v1/models")
            assert r.status_code == 200 and r.content == b"ok"
    assert srv.connections == 1


async def test_idle_connection_closed_by_server_is_not_reused() -> None:
    async with (
        serve(keepalive_handler(idle_close_s=0.1)) as srv,
        gateway_client(srv.port) as client,
    ):
        url = f"http://127.0.0.1:{srv.port}/v1/models"
        assert (await client.get(url)).status_code == 200
        await asyncio.sleep(0.3)  # the server has closed the idle connection by now
        assert (await client.get(url)).status_code == 200
    assert srv.connections == 2


async def test_streamed_body_arrives_as_written_and_buffered_pieces_together() -> None:
    release = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await release.wait()  # the rest only after the client saw the first piece
        writer.write(b"6\r\nsecond\r\n5\r\nthird\r\n0\r\n\r\n")  # two HTTP chunks, one write
        await writer.drain()

    async with serve(handle) as srv, gateway_client(srv.port) as client:
        request = client.build_request("GET", f"http://127.0.0.1:{srv.port}/v1/x")
        resp = await client.send(request, stream=True)
        read = body_reader(resp)
        assert await read() == b"first"
        release.set()
        await asyncio.sleep(0.1)  # both chunks are in the connection's buffer
        assert await read() == b"secondthird"
        assert await read() == b""
        await resp.aclose()


async def test_a_read_cancelled_while_waiting_loses_nothing() -> None:
    """The relay's deadlines cancel waiting reads; the next read gets the data."""
    release = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        await release.wait()
        writer.write(b"5\r\nlater\r\n0\r\n\r\n")
        await writer.drain()

    async with serve(handle) as srv, gateway_client(srv.port) as client:
        request = client.build_request("GET", f"http://127.0.0.1:{srv.port}/v1/x")
        resp = await client.send(request, stream=True)
        read = body_reader(resp)
        for _ in range(3):
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.05):
                    await read()
        release.set()
        assert await read() == b"later"
        assert await read() == b""
        await resp.aclose()
    assert srv.connections == 1


async def test_abandoning_a_body_closes_the_connection() -> None:
    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        with contextlib.suppress(ConnectionError):
            while not await _eof_within(reader, 0.01):  # a tick every 10 ms until EOF
                writer.write(b"4\r\ntick\r\n")
                await writer.drain()
        srv.closed.set()

    async with serve(endless) as srv, gateway_client(srv.port) as client:
        request = client.build_request("GET", f"http://127.0.0.1:{srv.port}/v1/x")
        resp = await client.send(request, stream=True)
        assert await body_reader(resp)() == b"tick"
        await resp.aclose()
        await asyncio.wait_for(srv.closed.wait(), 2)  # the server saw the connection go


async def _eof_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """True when the client closed the connection (EOF) within ``seconds``."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            return await reader.read(1) == b""
    return False


async def test_refused_connect_is_connect_error() -> None:
    async with serve(keepalive_handler()) as srv:
        pass  # the port is free again
    async with gateway_client(srv.port) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{srv.port}/v1/models")


async def test_read_timeout_reset_and_garbage_are_httpx_errors() -> None:
    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(5)

    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await writer.drain()
        writer.transport.abort()  # RST mid-body

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"this is not HTTP\r\n\r\n")
        await writer.drain()

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)  # and close without an answer

    async with serve(hang) as srv, gateway_client(srv.port) as client:
        t0 = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            await client.get(f"http://127.0.0.1:{srv.port}/v1/models", timeout=0.2)
        assert time.monotonic() - t0 < 2
    async with serve(reset) as srv, gateway_client(srv.port) as client:
        with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
            await client.get(f"http://127.0.0.1:{srv.port}/v1/models")
    for handler in (garbage, hang_up):
        async with serve(handler) as srv, gateway_client(srv.port) as client:
            with pytest.raises(httpx.RemoteProtocolError):
                await client.get(f"http://127.0.0.1:{srv.port}/v1/models")


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
    transport = UpstreamTransport(verify=client_ctx, max_connections=4, keepalive_expiry=30)
    async with (
        serve(keepalive_handler(b"secret"), ssl_ctx=server_ctx) as srv,
        httpx.AsyncClient(transport=transport) as client,
    ):
        for _ in range(2):
            r = await client.get(f"https://localhost:{srv.port}/")
            assert r.status_code == 200 and r.content == b"secret"
        with pytest.raises(httpx.ConnectError):  # an unknown certificate is refused
            async with httpx.AsyncClient(
                transport=UpstreamTransport(max_connections=1, keepalive_expiry=30)
            ) as strict:
                await strict.get(f"https://localhost:{srv.port}/")
    assert srv.connections == 1  # both requests on one connection (no handshake: no handler)
