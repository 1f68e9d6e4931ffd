"""Tenants' shares across two gateway replicas sharing one real Redis: the plans' split
of the slots between weights, VTC between equal weights.

The upstream is a FakeUpstream stand-in for vLLM with a fixed token rate; the gateway
caps it with ``max_concurrent``, counted over both replicas. Received service is
measured at the clients: w_p·prompt (at the first token) + w_q·output tokens, in a
window after the backlog has formed.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest

from qos.fairness import W_OUTPUT, W_PROMPT
from qos.prompt_tokens import estimate_prompt_tokens
from tests.support.cluster import (
    Log,
    backlog,
    capped_upstream,
    cluster_config,
    replicas,
    stream_once,
)

PROMPT = estimate_prompt_tokens({"messages": [{"role": "user", "content": "hi"}]})


def tenant(name: str, weight: float = 1.0) -> dict:
    return {"name": name, "api_keys": [f"key-{name}-000000"], "weight": weight, "max_queued": 64}


def clients(gws, name: str, n: int) -> list:
    """``n`` clients of tenant ``name``, alternating between the replicas."""
    return [gws[i % len(gws)].client(f"key-{name}-000000") for i in range(n)]


async def test_weights_one_and_two_get_one_to_two(redis_server, key_prefix) -> None:
    """Both backlogged, weights 1 : 2 over 6 slots: the plans give them 2 and 4 slots,
    hence, requests being alike, service in the ratio 1 : 2."""
    async with capped_upstream(n_tokens=10, token_interval=0.004) as up:
        config = cluster_config(
            up.url,
            [tenant("a", 1.0), tenant("b", 2.0)],
            redis_url=redis_server.url,
            prefix=key_prefix,
            max_concurrent=6,
        )
        async with replicas(config) as gws:
            log = Log()
            cs = {"a": clients(gws, "a", 8), "b": clients(gws, "b", 8)}
            start = time.monotonic()
            end = start + 4.0
            await asyncio.gather(
                *(backlog(c, name, log, end, (0, 0)) for name in cs for c in cs[name])
            )
            for c in cs["a"] + cs["b"]:
                await c.aclose()
            a = log.service("a", start + 1.0, end, PROMPT, W_PROMPT, W_OUTPUT)
            b = log.service("b", start + 1.0, end, PROMPT, W_PROMPT, W_OUTPUT)
            assert a > 0 and b / a == pytest.approx(2.0, rel=0.10), (a, b)
            assert up.peak <= 6  # the cap holds over both replicas
            for gw in gws:  # both replicas admitted work of both tenants
                for name in ("a", "b"):
                    labels = {"tenant": name, "outcome": "admitted"}
                    registry = gw.state.metrics.registry
                    assert registry.get_sample_value("tokenpace_admissions_total", labels) > 0


async def test_light_tenant_is_not_stuck_behind_backlog(redis_server, key_prefix) -> None:
    async with capped_upstream(n_tokens=10, token_interval=0.02) as up:
        config = cluster_config(
            up.url,
            [tenant("heavy"), tenant("light")],
            redis_url=redis_server.url,
            prefix=key_prefix,
            max_concurrent=2,
        )
        async with replicas(config) as gws:
            log = Log()
            heavy = clients(gws, "heavy", 24)
            light = clients(gws, "light", 2)
            start = time.monotonic()
            end = start + 3.5

            async def light_loop() -> None:
                await asyncio.sleep(1.0)  # the heavy backlog is there first
                i = 0
                while time.monotonic() < end - 0.5:
                    await stream_once(light[i % 2], "light", log)
                    i += 1
                    await asyncio.sleep(0.3)

            await asyncio.gather(
                light_loop(), *(backlog(c, "heavy", log, end, (0, 0)) for c in heavy)
            )
            for c in heavy + light:
                await c.aclose()
            tier_ttft = 1.0  # chat
            assert len(log.ttfts["light"]) >= 3
            assert max(log.ttfts["light"]) < tier_ttft, log.ttfts["light"]
            # the test means something: the backlogged tenant does wait longer than that
            assert statistics.median(log.ttfts["heavy"][10:]) > tier_ttft


async def test_returning_tenant_neither_starves_nor_is_starved(redis_server, key_prefix) -> None:
    async with capped_upstream(n_tokens=10, token_interval=0.01) as up:
        config = cluster_config(
            up.url,
            [tenant("a"), tenant("b")],
            redis_url=redis_server.url,
            prefix=key_prefix,
            max_concurrent=2,
        )
        async with replicas(config) as gws:
            log = Log()
            ca, cb = clients(gws, "a", 6), clients(gws, "b", 6)
            start = time.monotonic()
            back = start + 2.5  # b idles from 0.5 s to 2.5 s: a gets everything meanwhile
            end = back + 2.0
            await asyncio.gather(
                *(backlog(c, "a", log, end, (0, 0)) for c in ca),
                *(backlog(c, "b", log, end, (start + 0.5, back)) for c in cb),
            )
            for c in ca + cb:
                await c.aclose()
            a = log.service("a", back + 0.3, end, PROMPT, W_PROMPT, W_OUTPUT)
            b = log.service("b", back + 0.3, end, PROMPT, W_PROMPT, W_OUTPUT)
            share = b / (a + b)
            # without the lift b would take ~everything (its counter far behind a's);
            # with it they share; b still gets its half (not starved by its old counter)
            assert 0.35 < share < 0.65, (a, b)
