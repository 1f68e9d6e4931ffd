"""Faults against real processes: a ``tokenpace serve`` process in front of
``bench/fixed_rate_upstream.py`` (a stand-in for vLLM streaming at a fixed rate).

A backend killed mid-stream; a backend down, then back; a storm of client disconnects;
slowloris (slow headers, slow bodies); oversized headers and bodies; the metrics port
and the docs switch. (Redis killed and restarted empty, with keys and revocations
checked afterwards: tests/gateway/http/test_keys_durability.py and
tests/gateway/store/test_resilient.py.)
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.ports import free_port
from tests.support.process import KEY, Process, gateway_process, upstream_process

AUTH = {"Authorization": f"Bearer {KEY}"}


def chat(tokens: int = 40, stream: bool = True) -> dict:
    body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return {**body, "max_tokens": tokens}


@pytest.fixture
def procs(request) -> Iterator[tuple[Process, Process]]:
    overrides = getattr(request, "param", {})
    up = upstream_process().start()
    gw = gateway_process(up.url, **overrides)
    try:
        gw.start()
        yield gw, up
    finally:
        gw.stop()
        up.stop()


async def settle(measure, target: int, timeout: float = 5.0) -> int:
    """``measure()`` once it is at most ``target`` (or its value when time runs out)."""
    deadline = time.monotonic() + timeout
    while (value := measure()) > target and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return value


async def events(resp: httpx.Response) -> list:
    out = []
    async for line in resp.aiter_lines():
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_backend_killed_mid_stream_ends_every_stream_cleanly(procs) -> None:
    gw, up = procs

    async def one(client: httpx.AsyncClient) -> tuple[list, float]:
        async with client.stream("POST", "/v1/chat/completions", json=chat(400)) as r:
            assert r.status_code == 200
            got = await events(r)
            return got, time.monotonic()

    async with httpx.AsyncClient(base_url=gw.url, headers=AUTH, timeout=10) as client:
        tasks = [asyncio.create_task(one(client)) for _ in range(30)]
        await asyncio.sleep(1.5)  # every stream is under way (20 tokens/s)
        killed = time.monotonic()
        up.kill()
        results = await asyncio.gather(*tasks)
    for got, ended in results:
        assert got[-1] == "[DONE]"
        assert got[-2]["error"]["code"] == "upstream_truncated", got[-2]
        assert any("choices" in e for e in got[:-2])  # tokens came before the kill
        assert ended - killed < 3.0


async def test_backend_down_then_back(procs) -> None:
    gw, up = procs
    async with httpx.AsyncClient(base_url=gw.url, headers=AUTH, timeout=10) as client:
        assert (await client.post("/v1/chat/completions", json=chat(3, False))).status_code == 200
        up.kill()
        for stream in (False, True, False):
            r = await client.post("/v1/chat/completions", json=chat(3, stream))
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "backend_unavailable"
            assert int(r.headers["retry-after"]) >= 1
        assert (await client.get("/readyz")).status_code == 503
        up.start()  # the same port
        deadline = time.monotonic() + 5.0
        while (await client.get("/readyz")).status_code != 200:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        assert (await client.post("/v1/chat/completions", json=chat(3, False))).status_code == 200


async def test_a_storm_of_client_disconnects_leaks_nothing(procs) -> None:
    gw, up = procs
    async with httpx.AsyncClient(base_url=gw.url, headers=AUTH, timeout=10) as client:
        assert (await client.post("/v1/chat/completions", json=chat(2, False))).status_code == 200
    await asyncio.sleep(0.5)
    gw_fds, up_fds = gw.fds(), up.fds()

    async def leave_early() -> None:
        async with (
            httpx.AsyncClient(base_url=gw.url, headers=AUTH, timeout=10) as c,
            c.stream("POST", "/v1/chat/completions", json=chat(1000)) as r,
        ):
            async for line in r.aiter_lines():
                if '"content"' in line:
                    return  # one token, then the connection goes

    for _ in range(2):  # 2 waves of 100
        await asyncio.gather(*(leave_early() for _ in range(100)))
    # the upstream connections are closed (generations aborted) and nothing is left open
    assert await settle(up.fds, up_fds + 2) <= up_fds + 2
    assert await settle(gw.fds, gw_fds + 2) <= gw_fds + 2
    async with httpx.AsyncClient(base_url=gw.url, headers=AUTH, timeout=10) as client:
        assert (await client.post("/v1/chat/completions", json=chat(2, False))).status_code == 200


SLOW = {"server": {"header_timeout_s": 1.0, "body_timeout_s": 1.0}}


@pytest.mark.parametrize("procs", [SLOW], indirect=True)
async def test_slowloris_connections_are_closed_and_health_stays_fast(procs) -> None:
    gw, _ = procs
    await asyncio.sleep(0.3)
    baseline = gw.fds()
    host, port = "127.0.0.1", gw.port
    body_head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    ).encode()

    async def slow(first: bytes, drip: bytes) -> float:
        """Send ``first``, then one byte of ``drip`` every 0.3 s until the server closes."""
        reader, writer = await asyncio.open_connection(host, port)
        start = time.monotonic()
        writer.write(first)
        closed = asyncio.create_task(reader.read(-1))
        try:
            for byte in drip:
                if closed.done():
                    break
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.3)
            await asyncio.wait_for(closed, 5.0)
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
        return time.monotonic() - start

    attack = [slow(b"GET /healthz HTTP/1.1\r\n", b"X-Slow: " + b"a" * 100) for _ in range(100)]
    attack += [slow(body_head, b"{" + b" " * 100) for _ in range(100)]
    running = asyncio.gather(*attack)
    await asyncio.sleep(0.5)
    async with httpx.AsyncClient(base_url=gw.url, timeout=5) as client:
        start = time.monotonic()
        assert (await client.get("/healthz")).status_code == 200
        assert time.monotonic() - start < 1.0  # served in the middle of the attack
    held = await running
    assert max(held) < 4.0  # 1 s timeouts, plus the lingering close and a loaded CI
    assert await settle(gw.fds, baseline + 2) <= baseline + 2


async def test_oversized_headers_and_bodies_cost_no_memory(procs) -> None:
    gw, _ = procs
    await asyncio.sleep(0.3)
    rss = gw.rss_mib()
    host, port = "127.0.0.1", gw.port

    async def big_header() -> int:
        reader, writer = await asyncio.open_connection(host, port)
        answer = asyncio.create_task(reader.read(-1))
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
        try:
            for _ in range(8 * 64):  # 8 MiB in 16 KiB writes
                if answer.done():
                    break
                writer.write(b"a" * 16384)
                await writer.drain()
        except ConnectionError:
            pass
        raw = await asyncio.wait_for(answer, 5.0)
        writer.close()
        return int(raw.split()[1])

    async def held_body() -> int:
        """No key, a 4 MiB body announced, 64 KiB of it sent: answered at once."""
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 4194304\r\n\r\n" + b" " * 65536
        )
        raw = await asyncio.wait_for(reader.read(-1), 5.0)
        writer.close()
        return int(raw.split()[1])

    assert await asyncio.gather(*(big_header() for _ in range(4))) == [431] * 4
    assert await asyncio.gather(*(held_body() for _ in range(50))) == [401] * 50
    async with httpx.AsyncClient(base_url=gw.url, headers=AUTH, timeout=10) as client:
        big = {**chat(3, False), "pad": "x" * (5 * 2**20)}  # over limits.max_body_bytes
        r = await client.post("/v1/chat/completions", json=big)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert gw.rss_mib() - rss < 40  # was +254 MiB (headers) and +478 MiB (bodies)


async def test_metrics_on_their_own_port_and_docs_off() -> None:
    up = upstream_process().start()
    metrics_port = free_port()
    gw = gateway_process(up.url, metrics={"port": metrics_port}, server={"docs": False})
    try:
        gw.start()
        async with httpx.AsyncClient(timeout=5) as client:
            r = await client.get(f"{gw.url}/metrics")
            assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"
            r = await client.get(f"http://127.0.0.1:{metrics_port}/metrics")
            assert r.status_code == 200 and "tokenpace_requests" in r.text
            r = await client.get(f"http://127.0.0.1:{metrics_port}/healthz")
            assert r.status_code == 404  # the metrics port serves nothing else
            for path in ("/docs", "/redoc", "/openapi.json"):
                assert (await client.get(gw.url + path)).status_code == 404
            assert (await client.get(gw.url + "/healthz")).status_code == 200
    finally:
        gw.stop()
        up.stop()
