"""Admission details: vLLM /metrics back-pressure, prompt estimates, the queue wait cap."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from gateway.app import create_app
from gateway.backends.http import vllm_gauge
from tests.support.cluster import CappedUpstream, chat, cluster_config, replicas
from tests.support.gateway import Gateway
from tests.support.servers import run_server

KEY = "key-acme-00000000"
TENANTS = [{"name": "acme", "api_keys": [KEY]}]


class VllmLike(CappedUpstream):
    """A FakeUpstream stand-in that also serves vLLM-style Prometheus /metrics."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kv = 0.0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/metrics":
            text = (
                "# HELP vllm:kv_cache_usage_perc KV-cache usage.\n"
                f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {self.kv}\n'
                'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n'
            ).encode()
            headers = [(b"content-type", b"text/plain")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": text})
            return
        await super().__call__(scope, receive, send)


@asynccontextmanager
async def one_replica(
    fake: CappedUpstream, key_prefix: str, *, vllm_metrics: bool = False, **config: Any
) -> AsyncIterator[Gateway]:
    """One gateway replica (memory store) in front of ``fake``, served on a free port."""
    async with run_server(fake) as url:
        fake.url = url
        cfg = cluster_config(url, TENANTS, redis_url=None, prefix=key_prefix, **config)
        cfg.backends[0].vllm_metrics = vllm_metrics
        async with replicas(cfg, 1) as (gw,):
            yield gw


def test_vllm_gauge_parsing() -> None:
    text = 'vllm:gpu_cache_usage_perc{model_name="a"} 0.5\nvllm:num_requests_waiting 3\n'
    assert vllm_gauge(text, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc") == 0.5
    assert vllm_gauge(text, "vllm:num_requests_waiting") == 3.0
    assert vllm_gauge(text, "vllm:missing") is None


async def test_full_kv_cache_holds_requests_in_the_queue(key_prefix) -> None:
    fake = VllmLike(n_tokens=2, token_interval=0.001)
    admission = {"metrics_interval_s": 0.05, "poll_interval_s": 0.02}
    async with (
        one_replica(fake, key_prefix, vllm_metrics=True, admission=admission) as gw,
        gw.client(KEY) as c,
    ):
        fake.kv = 0.99
        await asyncio.sleep(0.15)
        start = time.monotonic()
        pending = asyncio.create_task(c.post("/v1/chat/completions", json=chat()))
        await asyncio.sleep(0.3)
        assert not pending.done() and fake.bodies == []
        fake.kv = 0.2
        r = await pending
        assert r.status_code == 200 and time.monotonic() - start >= 0.3


async def test_queue_wait_is_capped(key_prefix) -> None:
    fake = CappedUpstream(n_tokens=30, token_interval=0.02)
    admission = {"max_wait_s": 0.2, "poll_interval_s": 0.02}
    async with (
        one_replica(fake, key_prefix, max_concurrent=1, admission=admission) as gw,
        gw.client(KEY) as c,
    ):
        first = asyncio.create_task(c.post("/v1/chat/completions", json=chat(stream=True)))
        await asyncio.sleep(0.1)
        late = await c.post("/v1/chat/completions", json=chat())
        assert late.status_code == 503 and late.json()["error"]["code"] == "queue_timeout"
        assert (await first).status_code == 200
        assert await gw.state.store.in_flight("up") == 0


async def test_idle_admission_loops_sleep_until_there_is_work(key_prefix, monkeypatch) -> None:
    """The poll and charge loops do not wake while nothing waits and nothing is to be
    charged; a queued request is polled every ``poll_interval_s``, streamed tokens are
    charged every ``charge_interval_s``."""
    real_sleep = asyncio.sleep
    wakes: list[tuple[str, float]] = []  # (loop, delay) of each sleep of the two loops

    async def counted_sleep(delay: float, result: Any = None) -> Any:
        task = asyncio.current_task()
        name = task.get_name() if task is not None else ""
        if name in ("tokenpace-admission-poll", "tokenpace-admission-charge"):
            wakes.append((name.rsplit("-", 1)[1], delay))
        return await real_sleep(delay, result)

    monkeypatch.setattr(asyncio, "sleep", counted_sleep)
    fake = VllmLike(n_tokens=3, token_interval=0.001)
    admission = {"metrics_interval_s": 0.02, "poll_interval_s": 0.01, "charge_interval_s": 0.015}
    async with (
        one_replica(fake, key_prefix, vllm_metrics=True, admission=admission) as gw,
        gw.client(KEY) as c,
    ):
        fake.kv = 0.99  # the backend reports a full KV cache: requests queue
        await real_sleep(0.2)
        assert wakes == []  # idle: 20 polls and 13 charges before they slept
        pending = asyncio.create_task(c.post("/v1/chat/completions", json=chat(stream=True)))
        while not any(loop == "poll" for loop, _ in wakes):
            await real_sleep(0.01)
        await real_sleep(0.1)
        assert not pending.done() and fake.bodies == []
        polls = [d for loop, d in wakes if loop == "poll"]
        assert len(polls) >= 2 and set(polls) == {0.01}
        assert not any(loop == "charge" for loop, _ in wakes)
        fake.kv = 0.2
        r = await pending
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
        await real_sleep(0.1)  # the last poll and the tokens' charge are done
        charges = [d for loop, d in wakes if loop == "charge"]
        assert charges and set(charges) == {0.015}
        settled = len(wakes)
        await real_sleep(0.2)
        assert len(wakes) == settled  # idle again


def test_an_app_started_again_on_a_new_loop_still_charges(key_prefix) -> None:
    """The admission loops wait on events of the loop they run on, not the first one."""
    config = cluster_config(
        "http://127.0.0.1:9",
        TENANTS,
        redis_url=None,
        prefix=key_prefix,
        admission={"charge_interval_s": 0.01},
    )
    gw = create_app(config).state.gateway

    async def charged_while_running() -> bool:
        gw.admission.start()
        try:
            await asyncio.sleep(0.05)  # the loops wait for work
            before = (await gw.store.counters()).get("acme", 0.0)
            gw.admission.add_usage("acme", 1.0, 10, 60)
            for _ in range(500):
                if (await gw.store.counters()).get("acme", 0.0) > before:
                    return True
                await asyncio.sleep(0.01)
            return False
        finally:
            await gw.admission.aclose()

    assert asyncio.run(charged_while_running())
    assert asyncio.run(charged_while_running())
