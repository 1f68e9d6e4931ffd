"""Telemetry tokens: a report authenticated by its response's token instead of the API key."""

from __future__ import annotations

import json
import time
from contextlib import AsyncExitStack
from typing import Any

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from gateway.config.schema import TelemetryConfig
from gateway.errors import GatewayError
from gateway.store import MemoryStore
from gateway.telemetry.tokens import TOKEN_HEADER, TelemetryTokens, TokenClaims, sign, verify
from tests.support.fake_upstream import MODEL, upstream
from tests.support.gateway import backend_entry, gateway, make_config
from tests.support.servers import run_server

SECRET = "s" * 40
URL = "/v1/tokenpace/telemetry"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
ON_TIME = [[1.0 + i / 4.8, 1] for i in range(6)]


def report(rid: str, **extra: Any) -> dict[str, Any]:
    return {
        "request_id": rid,
        "expected": {"ttft": 1.0, "tds": 4.8},
        "arrivals": ON_TIME,
        "displayed": ON_TIME,
        "outcome": "completed",
        "sdk": {"name": "tokenpace-web", "version": "0.1.0"},
        **extra,
    }


async def completion(gw, *, stream: bool = True) -> tuple[str, str]:
    """(request id, telemetry token) of one served request."""
    async with gw.client() as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "stream": stream})
        assert r.status_code == 200, r.text
        return r.headers["x-request-id"], r.headers[TOKEN_HEADER]


def anonymous(gw) -> httpx.AsyncClient:
    return gw.client("")


async def test_a_token_authenticates_one_report_of_its_own_request() -> None:
    async with upstream() as fake, gateway(make_config([backend_entry(fake, "up")])) as gw:
        rid, token = await completion(gw)
        rid2, token2 = await completion(gw, stream=False)
        assert token != token2
        async with anonymous(gw) as c:
            r = await c.post(URL, json=report(rid), headers={TOKEN_HEADER: token})
            assert r.status_code == 200, r.text
            assert r.json()["request_id"] == rid
            # single use: the same token again is refused, nothing stored twice
            again = await c.post(URL, json=report(rid), headers={TOKEN_HEADER: token})
            assert again.status_code == 403
            assert again.json()["error"]["code"] == "telemetry_token_used"
            # a beacon: text/plain, the token inside the JSON body
            beacon = json.dumps({**report(rid2), "telemetry_token": token2})
            r = await c.post(URL, content=beacon, headers={"Content-Type": "text/plain"})
            assert r.status_code == 200, r.text
            assert r.json()["request_id"] == rid2
        summary = await gw.state.telemetry.summary("acme", 60)
        assert summary["tenants"]["acme"]["overall"]["client"]["count"] == 2


async def test_forged_malformed_expired_and_missing_tokens_get_401() -> None:
    async with upstream() as fake:
        config = make_config([backend_entry(fake, "up")], telemetry={"token_secret": SECRET})
        async with gateway(config) as gw:
            rid, token = await completion(gw)
            head, payload, sig = token.split(".")
            now = int(time.time())
            forged = [
                "not-a-token",
                f"{head}.{payload}",
                f"{head}.{payload}.{sig[:-2]}AA",  # signature altered
                sign(b"t" * 40, TokenClaims(rid, "acme", now + 600)),  # another secret
                sign(SECRET.encode(), TokenClaims(rid, "nobody", now + 600)),  # no such tenant
                f"tpt2.{payload}.{sig}",
            ]
            expired = sign(SECRET.encode(), TokenClaims(rid, "acme", now - 1))
            async with anonymous(gw) as c:
                for bad in [*forged, expired]:
                    r = await c.post(URL, json=report(rid), headers={TOKEN_HEADER: bad})
                    assert r.status_code == 401, (bad, r.text)
                    error = r.json()["error"]
                    assert error["code"] == "invalid_telemetry_token"
                    assert error["type"] == "authentication_error"
                assert "expired" in r.json()["error"]["message"]
                beacon = json.dumps({**report(rid), "telemetry_token": 42})
                r = await c.post(URL, content=beacon, headers={"Content-Type": "text/plain"})
                assert r.status_code == 401
                r = await c.post(URL, json=report(rid))  # neither key nor token
                assert r.status_code == 401
                assert TOKEN_HEADER in r.json()["error"]["message"]
                # nothing was stored by the refused reports: the real token still works
                r = await c.post(URL, json=report(rid), headers={TOKEN_HEADER: token})
                assert r.status_code == 200, r.text


async def test_tokens_live_token_ttl_s_and_name_their_request_and_tenant() -> None:
    async with upstream() as fake:
        config = make_config(
            [backend_entry(fake, "up")], telemetry={"token_secret": SECRET, "token_ttl_s": 60}
        )
        async with gateway(config) as gw:
            rid, token = await completion(gw)
            claims = verify(SECRET.encode(), token, time.time())
            assert (claims.request_id, claims.tenant) == (rid, "acme")
            assert abs(claims.expires - (time.time() + 60)) < 5


async def test_a_token_for_another_request_or_after_a_key_report_gets_403() -> None:
    async with upstream() as fake, gateway(make_config([backend_entry(fake, "up")])) as gw:
        rid_a, token_a = await completion(gw)
        rid_b, token_b = await completion(gw)
        async with anonymous(gw) as c, gw.client() as keyed:
            r = await c.post(URL, json=report(rid_b), headers={TOKEN_HEADER: token_a})
            assert r.status_code == 403
            assert r.json()["error"]["code"] == "telemetry_token_mismatch"
            assert r.json()["error"]["type"] == "permission_error"
            # the refused report stored nothing for b; a report with the key wins, then b's
            # token finds the request reported
            assert (await keyed.post(URL, json=report(rid_b))).status_code == 200
            r = await c.post(URL, json=report(rid_b), headers={TOKEN_HEADER: token_b})
            assert r.status_code == 403
            # a body that fails validation is refused without using the token up
            r = await c.post(
                URL, json=report(rid_a, outcome="great"), headers={TOKEN_HEADER: token_a}
            )
            assert r.status_code == 400
            assert (
                await c.post(URL, json=report(rid_a), headers={TOKEN_HEADER: token_a})
            ).status_code == 200


async def test_replicas_on_one_redis_share_the_secret(redis_server, key_prefix) -> None:
    async with AsyncExitStack() as stack:
        fake = await stack.enter_async_context(upstream())
        store = {"redis_url": redis_server.url, "key_prefix": key_prefix}
        a = await stack.enter_async_context(
            gateway(make_config([backend_entry(fake, "up")], store=store))
        )
        b = await stack.enter_async_context(
            gateway(make_config([backend_entry(fake, "up")], store=store))
        )
        rid, token = await completion(a)
        other = make_config(
            [backend_entry(fake, "up")], store={**store, "key_prefix": "x" + key_prefix}
        )
        c = await stack.enter_async_context(gateway(other))
        async with anonymous(c) as client:
            # another store (another deployment) has another secret
            r = await client.post(URL, json=report(rid), headers={TOKEN_HEADER: token})
            assert r.status_code == 401
        async with anonymous(b) as client:
            r = await client.post(URL, json=report(rid), headers={TOKEN_HEADER: token})
            assert r.status_code == 200, r.text
        assert await a.state.telemetry_tokens.secret() == await b.state.telemetry_tokens.secret()


async def test_a_relaying_backend_passes_the_token_on() -> None:
    """The page's own backend holds the key, relays the stream and the token header; the
    page reports with the token alone."""
    async with upstream() as fake, gateway(make_config([backend_entry(fake, "up")])) as gw:
        llm = openai.AsyncOpenAI(base_url=gw.base_url, api_key="tp-test-key-acme-0001")

        async def chat(request: Request) -> StreamingResponse:
            raw = await llm.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
            )
            passed = {
                h: raw.headers[h]
                for h in ("X-Request-Id", "X-TokenPace-Tier", "X-TokenPace-TTFT", TOKEN_HEADER)
            }

            async def events():
                async for chunk in raw.parse():
                    yield f"data: {chunk.model_dump_json()}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream", headers=passed)

        relay = Starlette(routes=[Route("/chat", chat, methods=["POST"])])
        async with run_server(relay) as relay_url, httpx.AsyncClient() as page:
            async with page.stream("POST", f"{relay_url}/chat") as r:
                chunks = [line async for line in r.aiter_lines() if line.startswith("data: {")]
                rid, token = r.headers["x-request-id"], r.headers[TOKEN_HEADER]
            assert chunks
            r = await page.post(f"{gw.url}{URL}", json=report(rid), headers={TOKEN_HEADER: token})
            assert r.status_code == 200, r.text
        await llm.close()


async def test_cross_origin_pages_may_read_and_send_the_token() -> None:
    async with upstream() as fake:
        config = make_config(
            [backend_entry(fake, "up")], cors={"allow_origins": ["http://page.example"]}
        )
        async with gateway(config) as gw, gw.client() as c:
            origin = {"Origin": "http://page.example"}
            r = await c.post("/v1/chat/completions", json=CHAT, headers=origin)
            exposed = r.headers["access-control-expose-headers"].lower()
            for name in (
                "x-request-id",
                "x-tokenpace-ttft",
                "x-tokenpace-tds",
                TOKEN_HEADER.lower(),
            ):
                assert name in exposed
            preflight = await c.options(
                URL,
                headers={
                    **origin,
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": f"content-type,{TOKEN_HEADER.lower()}",
                },
            )
            assert preflight.status_code == 200


async def test_a_token_verified_once_is_still_refused_once_it_expires(monkeypatch) -> None:
    tokens = TelemetryTokens(TelemetryConfig(token_secret=SECRET), MemoryStore(), {"acme"})
    now = time.time()
    token = sign(SECRET.encode(), TokenClaims("r1", "acme", int(now) + 60))
    assert (await tokens.verify(token)).request_id == "r1"
    assert (await tokens.verify(token)).request_id == "r1"  # from the verified tokens
    monkeypatch.setattr(time, "time", lambda: now + 61)
    with pytest.raises(GatewayError, match="expired") as err:
        await tokens.verify(token)
    assert err.value.status == 401
    monkeypatch.setattr(time, "time", lambda: now)
    tokens.tenants = set()  # the tenant was removed
    with pytest.raises(GatewayError, match="no longer exists"):
        await tokens.verify(token)
