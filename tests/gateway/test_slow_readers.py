"""A tenant whose clients stop reading cannot hold a capped backend's slots.

Real processes: ``redis-server``, ``tokenpace serve`` in front of
``bench/fixed_rate_upstream.py`` (a stand-in for vLLM) capped at 4 streams, and raw
sockets with a small receive buffer that open streams of 20,000 tokens and stop reading,
at once or after some of the stream.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from tests.support.process import KEY, Process, gateway_process, upstream_process
from tests.support.redis_server import RedisServer

HOG = "tp-slow-reader-hog-0001"
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
        tenants=[{"name": "acme", "api_keys": [KEY]}, {"name": "hog", "api_keys": [HOG]}],
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


def never_reading(gw: Process, key: str, max_tokens: int) -> socket.socket:
    """A connection with a 1 KiB receive buffer that sends a stream request and reads nothing."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
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
            left = read_first
            while left > 0:
                left -= len(sock.recv(min(left, 65536)))
        held_from = time.monotonic()
        while slots.zcard("{slow}:s:up") and time.monotonic() < held_from + 20:
            time.sleep(0.1)
        freed_after = time.monotonic() - held_from
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
