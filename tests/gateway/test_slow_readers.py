"""A tenant whose clients stop reading cannot hold a capped backend's slots.

Real processes: ``redis-server``, ``tokenpace serve`` in front of
``bench/fixed_rate_upstream.py`` (a stand-in for vLLM) capped at 4 streams, and raw
sockets with a small receive buffer that open streams of 20,000 tokens and stop reading,
at once or after some of the stream; and a tenant on the default plan that tries the
same while another tenant asks.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.process import KEY, Process, gateway_process, upstream_process
from tests.support.redis_server import RedisServer

HOG = "tp-slow-reader-hog-0001"
GREEDY = "tp-slow-reader-greedy-0001"
WRITE_TIMEOUT_S = 1.0
CAPPED = 4


@pytest.fixture(scope="module")
def gw() -> Iterator[tuple[Process, redis.Redis]]:
    server = RedisServer().start()
    up = upstream_process(rate=2000.0).start()
    backend = {"name": "up", "url": f"{up.url}/v1", "models": ["bench"], "health_path": "/health"}
    gateway = gateway_process(
        up.url,
        log_level="INFO",
        server={"write_timeout_s": WRITE_TIMEOUT_S},
        store={"redis_url": server.url, "key_prefix": "slow"},
        backends=[{**backend, "max_concurrent": CAPPED}],
        tenants=[
            {"name": "acme", "api_keys": [KEY]},
            # a plan allowed every slot: only the write timeout takes them back
            {"name": "hog", "api_keys": [HOG], "max_concurrent": CAPPED},
            {"name": "greedy", "api_keys": [GREEDY]},  # the default cap: all slots but one
        ],
    )
    slots = redis.Redis.from_url(server.url)
    try:
        gateway.start()
        yield gateway, slots
    finally:
        slots.close()
        gateway.stop()
        up.stop()
        server.stop()


def never_reading(
    gw: Process, key: str, max_tokens: int, receive_buffer: int = 1024
) -> socket.socket:
    """A connection with a small receive buffer that sends a stream request and reads nothing."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect(("127.0.0.1", gw.port))
    body = json.dumps(
        {
            "model": "bench",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens,
            "stream": True,
        }
    ).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n" % (key.encode(), len(body))
    )
    sock.sendall(head + body)
    return sock


def seconds_until_slots_free(slots: redis.Redis, within_s: float) -> float:
    """How long until no stream holds a slot of the capped backend (``within_s`` at most)."""
    start = time.monotonic()
    while slots.zcard("{slow}:s:up") and time.monotonic() < start + within_s:
        time.sleep(0.05)
    return time.monotonic() - start


def read_some(sock: socket.socket, size: int) -> None:
    """Read ``size`` bytes of the answer, or all of it if shorter."""
    while size > 0:
        got = sock.recv(min(size, 65536))
        if not got:
            return
        size -= len(got)


@pytest.mark.parametrize("read_first", [0, 8 * 1024, 256 * 1024])
def test_streams_nobody_reads_give_their_slots_back(
    gw: tuple[Process, redis.Redis], read_first: int
) -> None:
    """Four streams whose clients stopped reading held every slot of the capped backend
    until the next request was ``overloaded``; now each is cut once its writes stay
    blocked for ``server.write_timeout_s``, its slot given back and its tokens charged."""
    gateway, slots = gw
    charged = float(slots.hget("{slow}:vtc", "hog") or 0)
    hogs = [never_reading(gateway, HOG, 20_000) for _ in range(CAPPED)]
    try:
        deadline = time.monotonic() + 10
        while slots.zcard("{slow}:s:up") < CAPPED and time.monotonic() < deadline:
            time.sleep(0.05)
        assert slots.zcard("{slow}:s:up") == CAPPED  # all four streaming
        for sock in hogs:  # some of the stream, then nothing more
            read_some(sock, read_first)
        freed_after = seconds_until_slots_free(slots, within_s=20)
        assert slots.zcard("{slow}:s:up") == 0, "the streams nobody reads still hold slots"
        # the 20,000 tokens take 10 s at 2,000 a second: they were cut, not finished
        assert freed_after < 8.0, f"slots given back after {freed_after:.1f} s"
        with httpx.Client(base_url=gateway.url, timeout=20) as c:
            r = c.post(
                "/v1/chat/completions",
                headers={"Authorization": f"Bearer {KEY}"},
                json={"model": "bench", "messages": [{"role": "user", "content": "hi"}]},
            )
        assert r.status_code == 200, r.text
        assert "client read nothing for 1 s" in gateway.output()
        time.sleep(0.5)  # output tokens are charged in batches
        assert float(slots.hget("{slow}:vtc", "hog") or 0) > charged  # what was sent
    finally:
        for sock in hogs:
            sock.close()


def test_a_tenant_that_never_reads_leaves_a_slot_for_the_others(
    gw: tuple[Process, redis.Redis],
) -> None:
    """On the default plan a tenant holds at most all the capped backend's slots but one:
    its fourth never-reading stream waits in the queue behind the others' requests, and
    another tenant's stream starts within its tier's TTFT (chat: 1 s) while the first
    three still hold their slots, where before it waited until they were cut."""
    gateway, slots = gw
    greedy = [never_reading(gateway, GREEDY, 20_000) for _ in range(CAPPED)]
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
            slots.zcard("{slow}:s:up") == CAPPED - 1 and slots.hget("{slow}:wn", "greedy")
        ):
            time.sleep(0.05)
        assert slots.zcard("{slow}:s:up") == CAPPED - 1  # three streaming, at its cap
        assert slots.hget("{slow}:wn", "greedy") == b"1"  # the fourth queued
        sent = time.monotonic()
        with (
            httpx.Client(base_url=gateway.url, timeout=20) as c,
            c.stream(
                "POST",
                "/v1/chat/completions",
                headers={"Authorization": f"Bearer {KEY}"},
                json={
                    "model": "bench",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 50,
                    "stream": True,
                },
            ) as r,
        ):
            assert r.status_code == 200
            lines = r.iter_lines()
            first = next(line for line in lines if '"content"' in line)
            ttft = time.monotonic() - sent
            holders = [
                slots.hget(f"{{slow}}:req:{rid.decode()}", "tenant")
                for rid in slots.zrange("{slow}:s:up", 0, -1)
            ]
            for _ in lines:
                pass
        assert first
        assert ttft < 1.0, f"the other tenant's first token after {ttft:.2f} s"
        assert holders.count(b"greedy") == CAPPED - 1, holders  # its streams were not cut
    finally:
        for sock in greedy:
            sock.close()
    # its queued stream is admitted once one of its own ends, never past its cap
    seconds_until_slots_free(slots, within_s=15)
    assert slots.zcard("{slow}:s:up") == 0


@settings(
    max_examples=4,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    read_first=st.integers(0, 512 * 1024),
    receive_buffer=st.sampled_from([1024, 8 * 1024, 64 * 1024]),
    max_tokens=st.integers(40_000, 65_536),  # 20-33 s at 2,000 a second; the plan's cap
)
def test_a_client_that_stops_reading_anywhere_gives_its_slot_back(
    gw: tuple[Process, redis.Redis], read_first: int, receive_buffer: int, max_tokens: int
) -> None:
    """Fuzzed: a long stream whose client, with any receive buffer, stops reading at
    any point is cut once the buffers between (the client's, the kernel's send buffer,
    up to megabytes) are full and its writes stay blocked for the write timeout: its
    slot is back well before the reply would have ended (20 s or more here)."""
    gateway, slots = gw
    cut_before = gateway.output().count("client read nothing")
    sock = never_reading(gateway, HOG, max_tokens, receive_buffer)
    try:
        sock.settimeout(10.0)
        status = sock.recv(12, socket.MSG_PEEK | socket.MSG_WAITALL)
        assert status == b"HTTP/1.1 200"  # admitted, streaming
        read_some(sock, read_first)
        freed_after = seconds_until_slots_free(slots, within_s=20)
        assert slots.zcard("{slow}:s:up") == 0, "a stream nobody reads still holds its slot"
        assert freed_after < 15.0, f"slot given back after {freed_after:.1f} s"
        assert gateway.output().count("client read nothing") > cut_before  # cut, not ended
    finally:
        sock.close()
