"""What one client connection may cost: header size, header and body read timeouts, the
connection cap, and authentication before the body is read.

Raw sockets against a real gateway served by uvicorn as ``tokenpace serve`` serves it
(:func:`gateway.runtime.server.uvicorn_config`); the upstream is the FakeUpstream stand-in.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from gateway.runtime.server import YOUNG_GENERATION_ALLOCATIONS
from tests.support.fake_upstream import MODEL, upstream
from tests.support.gateway import KEY, backend_entry, gateway, make_config

ROOT = Path(__file__).resolve().parents[3]

LIMITS = {"header_timeout_s": 0.5, "body_timeout_s": 0.5, "max_connections": 6}


async def connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    u = urlsplit(url)
    return await asyncio.open_connection(u.hostname, u.port)


async def response(reader: asyncio.StreamReader, timeout: float = 3.0) -> tuple[int, dict, bytes]:
    """The status, headers and body of one response (the connection closes after it)."""
    raw = await asyncio.wait_for(reader.read(-1), timeout)
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), headers, body


async def trickle(
    writer: asyncio.StreamWriter, data: bytes, size: int, pause: float, answer: asyncio.Task
) -> None:
    """Send ``data`` ``size`` bytes at a time, ``pause`` apart, until ``answer`` is done."""
    for i in range(0, len(data), size):
        if answer.done():
            return
        writer.write(data[i : i + size])
        await writer.drain()
        await asyncio.sleep(pause)


def openai_error(body: bytes, code: str) -> dict:
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == code, err
    return err


@pytest.fixture
async def gw():
    async with (
        upstream() as fake,
        gateway(make_config([backend_entry(fake, "a")], server=LIMITS)) as g,
    ):
        yield g


async def test_headers_over_the_limit_get_431_and_the_connection_closes(gw) -> None:
    reader, writer = await connect(gw.url)
    answer = asyncio.create_task(response(reader))
    big = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20)
    await trickle(writer, big, 1024, 0, answer)  # 1 MiB of one header, 1 KiB at a time
    status, headers, body = await answer
    assert status == 431
    assert headers["connection"] == "close"
    assert "32768 bytes" in openai_error(body, "headers_too_large")["message"]
    writer.close()
    # in one read (a whole request with headers past the limit), and many small headers
    for head in (
        b"X-Big: " + b"a" * 40_000,
        b"".join(b"X-%d: %s\r\n" % (i, b"b" * 90) for i in range(400)),
    ):
        reader, writer = await connect(gw.url)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + head.rstrip(b"\r\n") + b"\r\n\r\n")
        assert (await response(reader))[0] == 431
        writer.close()
    async with gw.client() as c:  # headers within the limit are served
        r = await c.get("/healthz", headers={"X-Big": "a" * 30_000})
        assert r.status_code == 200


async def test_a_body_is_not_read_before_the_key_is_checked(gw) -> None:
    """No key: 401 at once, while the 4 MiB body it announced has not been sent."""
    for auth in (b"", b"Authorization: Bearer wrong-key-123\r\n"):
        reader, writer = await connect(gw.url)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + auth
            + b'Content-Length: 4194304\r\n\r\n{"model": '
            + b" " * 65536
        )
        status, _, body = await response(reader)
        assert status == 401
        openai_error(body, "invalid_api_key")
        writer.close()
    # the admin routes need the admin key before their body is read
    reader, writer = await connect(gw.url)
    writer.write(
        b"POST /v1/tokenpace/admin/tenants/acme/keys HTTP/1.1\r\nHost: x\r\n"
        + f"Authorization: Bearer {KEY}\r\n".encode()
        + b"Content-Length: 1000000\r\n\r\n{"
    )
    assert (await response(reader))[0] == 401
    writer.close()


async def test_slow_headers_and_slow_bodies_are_timed_out(gw) -> None:
    # headers one byte at a time: 408 once header_timeout_s has passed since the connect
    reader, writer = await connect(gw.url)
    start = time.monotonic()
    answer = asyncio.create_task(response(reader))
    await trickle(
        writer, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100, 1, 0.05, answer
    )
    status, _, body = await answer
    assert status == 408 and 0.4 < time.monotonic() - start < 3.0
    openai_error(body, "request_timeout")
    writer.close()
    # a body that stops coming: 408 once body_timeout_s has passed since the headers
    reader, writer = await connect(gw.url)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {KEY}\r\n".encode()
        + b'Content-Length: 1000\r\n\r\n{"model": '
    )
    status, _, body = await response(reader)
    assert status == 408
    openai_error(body, "request_timeout")
    writer.close()
    # a connection that sends nothing is closed without an answer
    reader, writer = await connect(gw.url)
    assert await asyncio.wait_for(reader.read(-1), 3.0) == b""
    writer.close()
    async with gw.client() as c:  # a normal request takes far less than either timeout
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        assert (await c.post("/v1/chat/completions", json=body)).status_code == 200


async def test_a_later_request_on_a_connection_gets_its_own_header_timeout(gw) -> None:
    # one timer per connection, moved lazily: the second request's headers are timed from
    # its own first byte, not from the connection's (nor left untimed)
    reader, writer = await connect(gw.url)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3.0)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    await reader.readexactly(length)
    await asyncio.sleep(0.3)  # the first deadline set on the connection falls in the next
    start = time.monotonic()
    answer = asyncio.create_task(asyncio.wait_for(reader.read(-1), 3.0))
    await trickle(writer, b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 100, 1, 0.05, answer)
    # closed (a connection that has answered before is closed without another answer)
    assert await answer == b"" and 0.4 < time.monotonic() - start < 3.0
    writer.close()


async def test_connections_past_the_cap_get_503_and_the_others_carry_on(gw) -> None:
    held = [await connect(gw.url) for _ in range(LIMITS["max_connections"])]
    await asyncio.sleep(0.05)
    reader, writer = await connect(gw.url)
    status, headers, body = await response(reader)
    assert status == 503 and headers["retry-after"] == "1"
    openai_error(body, "server_busy")
    writer.close()
    r0, w0 = held[0]  # one of the connections under the cap is still served
    w0.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert (await response(r0))[0] == 200
    for _, w in held:
        w.close()
    await asyncio.sleep(0.1)
    async with gw.client() as c:  # room again once they are closed
        assert (await c.get("/healthz")).status_code == 200


def test_a_serving_process_freezes_its_start_up_and_collects_the_young_generation_rarely():
    """In a process of its own (the collector's settings are the process's): after
    start-up the app's objects are frozen, out of every collection's walk, and the young
    generation is collected every YOUNG_GENERATION_ALLOCATIONS allocations, not CPython's
    700 (at 700, with 100,000 requests remembered, full collections cost the gateway
    about 0.13 ms of CPU a request: docs/benchmarks.md, "Gateway cost")."""
    code = (
        "import gc, json\n"
        "from gateway.app import create_app\n"
        "from gateway.runtime.server import tune_garbage_collector\n"
        "before = gc.get_threshold()\n"
        "tune_garbage_collector()\n"
        "print(json.dumps([before, gc.get_threshold(), gc.get_freeze_count()]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    before, after, frozen = json.loads(out.stdout)
    assert before[0] == 700  # CPython's default: the setting is the gateway's own
    assert after == [YOUNG_GENERATION_ALLOCATIONS, before[1], before[2]]
    assert frozen > 50_000  # the imported libraries and the app's modules
