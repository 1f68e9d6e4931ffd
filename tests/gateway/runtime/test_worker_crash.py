"""A worker of ``tokenpace serve --workers 2`` killed (SIGKILL) while it holds a backend's
only admission slot: the supervisor releases the slot at once (the worker's holder tag,
:mod:`gateway.runtime.holders`), so the next request is admitted long before the slot's
lease (``admission.lease_s``) would have lapsed. Real processes: ``redis-server``, the
gateway, ``bench/fixed_rate_upstream.py`` (20 tokens a second)."""

from __future__ import annotations

import time

import httpx
import psutil
import redis

from tests.support.process import KEY, gateway_process, upstream_process
from tests.support.redis_server import RedisServer

LEASE_S = 30.0
AUTH = {"Authorization": f"Bearer {KEY}"}


def chat(tokens: int, stream: bool) -> dict:
    body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return {**body, "max_tokens": tokens}


def serving(workers: list[psutil.Process], port: int, client_port: int) -> psutil.Process:
    """The worker holding the connection from ``client_port`` to the gateway's ``port``."""
    for w in workers:
        for c in w.net_connections("tcp"):
            if c.laddr and c.laddr.port == port and c.raddr and c.raddr.port == client_port:
                return w
    raise AssertionError("no worker holds the connection")


def test_a_killed_workers_slot_is_released_at_once() -> None:
    server = RedisServer().start()
    up = upstream_process(rate=20.0).start()
    backend = {"name": "up", "url": f"{up.url}/v1", "models": ["bench"], "max_concurrent": 1}
    gw = gateway_process(
        up.url,
        store={"redis_url": server.url, "key_prefix": "crash"},
        admission={"lease_s": LEASE_S},
        backends=[{**backend, "health_path": "/health"}],
    )
    gw.args += ["--workers", "2"]
    slots = redis.Redis.from_url(server.url)
    try:
        gw.start(timeout=60)
        with (
            httpx.Client(base_url=gw.url, headers=AUTH, timeout=20) as client,
            client.stream("POST", "/v1/chat/completions", json=chat(2000, True)) as held,
        ):
            assert held.status_code == 200
            lines = held.iter_lines()
            while not next(lines).startswith("data: "):
                pass  # streaming: it holds the backend's one slot
            rid = held.headers["x-request-id"]
            assert slots.zrange("{crash}:s:up", 0, -1) == [rid.encode()]
            _, client_port = held.extensions["network_stream"].get_extra_info("client_addr")
            workers = [w for w in gw.ps.children() if "spawn_main" in " ".join(w.cmdline())]
            victim = serving(workers, gw.port, client_port)
            victim.kill()
            victim.wait(10)
            start = time.monotonic()
            with httpx.Client(base_url=gw.url, headers=AUTH, timeout=LEASE_S) as other:
                answer = other.post("/v1/chat/completions", json=chat(2, False))
            waited = time.monotonic() - start
        assert answer.status_code == 200, answer.text
        assert waited < LEASE_S / 3, f"admitted after {waited:.1f} s"
        assert "released" in gw.output()
        assert slots.zcard("{crash}:s:up") == 0
    finally:
        slots.close()
        gw.stop()
        up.stop()
        server.stop()
