"""Gateway replicas on one real Redis, in front of capped stub upstreams (no tests here).

Each replica is its own ``create_app`` served by its own uvicorn on its own port, as two
gateway processes would be; they share nothing but Redis and the upstream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from gateway.config.loader import parse_config
from gateway.config.schema import GatewayConfig
from tests.support.fake_upstream import MODEL, FakeUpstream
from tests.support.gateway import Gateway, gateway
from tests.support.servers import run_server


class CappedUpstream(FakeUpstream):
    """FakeUpstream (a stand-in for vLLM) that records its peak of concurrent streams."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.peak = 0

    async def _stream(self, body: dict, chat: bool, receive: Any, send: Any) -> None:
        self.peak = max(self.peak, self.active + 1)
        await super()._stream(body, chat, receive, send)


@asynccontextmanager
async def capped_upstream(**kwargs: Any) -> AsyncIterator[CappedUpstream]:
    fake = CappedUpstream(**kwargs)
    async with run_server(fake) as url:
        fake.url = url
        yield fake


def cluster_config(
    upstream_url: str,
    tenants: list[dict[str, Any]],
    *,
    redis_url: str | None,
    prefix: str,
    max_concurrent: int | None = None,
    **overrides: Any,
) -> GatewayConfig:
    data: dict[str, Any] = {
        "tenants": tenants,
        "backends": [
            {
                "name": "up",
                "url": f"{upstream_url}/v1",
                "models": [MODEL],
                "health_path": "/health",
                "max_concurrent": max_concurrent,
            }
        ],
        "timeouts": {"connect_s": 1.0, "first_byte_s": 10.0, "idle_s": 5.0, "request_s": 10.0},
        "health": {"interval_s": 30.0, "timeout_s": 0.5},
        # a loaded test machine can keep a Redis call past the shipped 0.5 s (503
        # store_busy); the tests that are about the store's timeout pass their own store
        "store": {
            "redis_url": redis_url,
            "key_prefix": prefix,
            "reconnect_interval_s": 0.2,
            "timeout_s": 5.0,
        },
        "admission": {"poll_interval_s": 0.02, "charge_interval_s": 0.02, "lease_s": 3.0},
        **overrides,
    }
    return parse_config(data)


@asynccontextmanager
async def replicas(config: GatewayConfig, n: int = 2) -> AsyncIterator[list[Gateway]]:
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(gateway(config)) for _ in range(n)]


def chat(content: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


@dataclass
class Log:
    """Client-side record of what each tenant received: (time, tokens) per chunk."""

    chunks: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    ttfts: dict[str, list[float]] = field(default_factory=dict)
    statuses: list[int] = field(default_factory=list)

    def service(self, tenant: str, t0: float, t1: float, prompt: int, w_p: float, w_q: float):
        """w_p·prompt per request whose first token came in [t0, t1) + w_q·tokens then."""
        total = 0.0
        for t, n in self.chunks.get(tenant, []):
            if t0 <= t < t1:
                total += w_q * n if n > 0 else w_p * prompt
        return total


async def stream_once(
    client: httpx.AsyncClient, tenant: str, log: Log, body: dict[str, Any] | None = None
) -> int:
    """One streaming request; logs a prompt marker (n=0) at the first token, then tokens."""
    sent = time.monotonic()
    first = True
    async with client.stream(
        "POST", "/v1/chat/completions", json=body or chat(stream=True)
    ) as resp:
        log.statuses.append(resp.status_code)
        if resp.status_code != 200:
            await resp.aread()
            return resp.status_code
        async for line in resp.aiter_lines():
            if line.startswith("data: {") and '"content":"t' in line.replace(" ", ""):
                now = time.monotonic()
                if first:
                    log.ttfts.setdefault(tenant, []).append(now - sent)
                    log.chunks.setdefault(tenant, []).append((now, 0))
                    first = False
                log.chunks.setdefault(tenant, []).append((now, 1))
    return 200


async def backlog(
    client: httpx.AsyncClient, tenant: str, log: Log, until: float, pause: tuple[float, float]
) -> None:
    """Send requests back to back until ``until`` (monotonic), idle during ``pause``."""
    while (now := time.monotonic()) < until:
        if pause[0] <= now < pause[1]:
            await asyncio.sleep(pause[1] - now)
            continue
        await stream_once(client, tenant, log)
