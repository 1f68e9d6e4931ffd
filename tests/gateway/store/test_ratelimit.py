"""Rate limits, budgets and the queue bound, enforced across two replicas on one Redis."""

from __future__ import annotations

import asyncio

from tests.support.cluster import capped_upstream, chat, cluster_config, replicas

KEY = "key-limited-000000"


def tenant(**limits) -> dict:
    return {"name": "limited", "api_keys": [KEY], **limits}


async def test_requests_per_minute_holds_across_replicas(redis_server, key_prefix) -> None:
    async with capped_upstream(n_tokens=2, token_interval=0.001) as up:
        config = cluster_config(
            up.url, [tenant(requests_per_minute=10)], redis_url=redis_server.url, prefix=key_prefix
        )
        async with replicas(config) as gws:
            cs = [gw.client(KEY) for gw in gws]
            responses = await asyncio.gather(
                *(cs[i % 2].post("/v1/chat/completions", json=chat()) for i in range(16))
            )
            for c in cs:
                await c.aclose()
    ok = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 429]
    assert len(ok) == 10 and len(refused) == 6  # R in total, not R per replica
    assert sorted(int(r.headers["x-ratelimit-remaining-requests"]) for r in ok) == list(range(10))
    for r in ok:
        assert r.headers["x-ratelimit-limit-requests"] == "10"
        assert r.headers["x-ratelimit-reset-requests"].endswith("s")
    for r in refused:
        assert 1 <= int(r.headers["retry-after"]) <= 120
        err = r.json()["error"]
        assert (err["type"], err["code"]) == ("rate_limit_error", "rate_limit_requests")
        assert r.headers["x-ratelimit-remaining-requests"] == "0"


async def test_tokens_per_minute_and_budget(key_prefix) -> None:
    async with capped_upstream(n_tokens=5, token_interval=0.001) as up:
        tenants = [
            tenant(tokens_per_minute=60),
            {"name": "quota", "api_keys": ["key-quota-000000"], "token_budget": 30},
        ]
        config = cluster_config(up.url, tenants, redis_url=None, prefix=key_prefix)
        async with replicas(config, 1) as (gw,):
            async with gw.client(KEY) as c:
                body = chat(max_tokens=5)
                first = await c.post("/v1/chat/completions", json=body)
                assert first.status_code == 200
                assert first.headers["x-ratelimit-limit-tokens"] == "60"
                big = await c.post("/v1/chat/completions", json=chat(max_tokens=100))
                assert big.status_code == 429
                assert big.json()["error"]["code"] == "rate_limit_tokens"
                assert (
                    "(this request alone is larger than the limit)"
                    in big.json()["error"]["message"]
                )
            async with gw.client("key-quota-000000") as c:
                codes = []
                for _ in range(4):
                    r = await c.post("/v1/chat/completions", json=chat(max_tokens=5))
                    codes.append(r.status_code)
                    await asyncio.sleep(0.1)  # output tokens are charged in batches
                last = await c.post("/v1/chat/completions", json=chat(max_tokens=5))
    assert codes == [200, 200, 200, 429]  # 5 prompt + 5 output tokens a request, of 30
    assert last.status_code == 429
    assert last.json()["error"]["code"] == "insufficient_quota"
    assert int(last.headers["retry-after"]) > 60


async def test_queue_bound_429_and_disconnect_leaves_queue(redis_server, key_prefix) -> None:
    async with capped_upstream(n_tokens=20, token_interval=0.02) as up:
        config = cluster_config(
            up.url,
            [tenant(max_queued=2)],
            redis_url=redis_server.url,
            prefix=key_prefix,
            max_concurrent=1,
        )
        async with replicas(config) as gws:
            store = gws[0].state.store
            c0, c1 = gws[0].client(KEY), gws[1].client(KEY)
            running = asyncio.create_task(c0.post("/v1/chat/completions", json=chat(stream=True)))
            await asyncio.sleep(0.15)
            waiting = [
                asyncio.create_task(c.post("/v1/chat/completions", json=chat())) for c in (c0, c1)
            ]
            await asyncio.sleep(0.15)
            over = await c1.post("/v1/chat/completions", json=chat())
            assert over.status_code == 429 and over.json()["error"]["code"] == "queue_full"
            assert int(over.headers["retry-after"]) >= 1
            # a queued client that goes away leaves the shared queue at once
            waiting[1].cancel()
            await asyncio.gather(waiting[1], return_exceptions=True)
            redis = store.redis.redis
            for _ in range(50):
                if int(await redis.hget(f"{{{key_prefix}}}:wn", "limited") or 0) == 1:
                    break
                await asyncio.sleep(0.01)
            assert int(await redis.hget(f"{{{key_prefix}}}:wn", "limited")) == 1
            assert (await running).status_code == 200
            assert (await waiting[0]).status_code == 200
            await c0.aclose()
            await c1.aclose()
        assert up.peak == 1
