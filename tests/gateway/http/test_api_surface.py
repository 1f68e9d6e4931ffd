"""The API surface a newcomer's tools expect, as OpenAI's API and common gateways give
it: one model retrieved by id (the official client's ``models.retrieve``), ``HEAD``
probes of liveness and readiness, a ``GET /`` that names the pages and the API, and the
bodies OpenAI refuses (an unknown message role; a tier given as numbers inside
``tier``) refused with what to write instead."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import openai
import pytest

from tests.support.fake_upstream import MODEL, upstream
from tests.support.gateway import KEY, Gateway, backend_entry, gateway, make_config

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture
async def gw() -> AsyncIterator[Gateway]:
    async with upstream() as fake, upstream(models=("any",)) as other:
        config = make_config([backend_entry(fake, "a"), backend_entry(other, "wild", models=["*"])])
        async with gateway(config) as running:
            yield running


def _client(gw: Gateway, **headers: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=gw.url, headers=headers, timeout=10)


async def test_a_model_is_retrieved_by_id_with_the_official_client(gw: Gateway) -> None:
    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
    try:
        model = await client.models.retrieve(MODEL)
        assert (model.id, model.object) == (MODEL, "model")
        assert (await client.models.retrieve("org/any-name")).id == "org/any-name"  # "*"
    finally:
        await client.close()


async def test_an_unknown_model_is_openais_404_and_the_route_needs_a_key(gw: Gateway) -> None:
    async with upstream() as fake:
        config = make_config([backend_entry(fake, "a")])
        async with gateway(config) as only, _client(only, Authorization=f"Bearer {KEY}") as c:
            r = await c.get("/v1/models/no-such-model")
            assert r.status_code == 404
            err = r.json()["error"]
            assert (err["code"], err["param"]) == ("model_not_found", "model")
            assert "no-such-model" in err["message"]
        async with gateway(config) as only, _client(only) as anonymous:
            assert (await anonymous.get(f"/v1/models/{MODEL}")).status_code == 401


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
async def test_head_probes_answer_like_get_without_a_body(gw: Gateway, path: str) -> None:
    async with _client(gw) as c:
        head, get = await c.head(path), await c.get(path)
    assert head.status_code == get.status_code == 200
    assert head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]


async def test_the_root_names_the_pages_and_the_api(gw: Gateway) -> None:
    async with _client(gw) as c:
        r = await c.get("/")
    assert r.status_code == 200
    body = r.json()
    assert body["links"] == {
        "api": "/v1",
        "demo": "/demo",
        "dashboard": "/dashboard",
        "docs": "/docs",
    }
    assert "/demo" in body["message"] and "/dashboard" in body["message"]


async def test_an_unknown_role_is_refused_naming_the_allowed_ones(gw: Gateway) -> None:
    body = {**CHAT, "messages": [{"role": "wizard", "content": "hi"}]}
    async with _client(gw, Authorization=f"Bearer {KEY}") as c:
        r = await c.post("/v1/chat/completions", json=body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "messages[0].role" and err["code"] == "invalid_value"
    for role in ("system", "developer", "user", "assistant", "tool"):
        assert f"'{role}'" in err["message"]


async def test_numbers_inside_tier_say_where_they_go(gw: Gateway) -> None:
    body = {**CHAT, "tokenpace": {"tier": {"ttft": 2, "tds": 10}}}
    async with _client(gw, Authorization=f"Bearer {KEY}") as c:
        r = await c.post("/v1/chat/completions", json=body)
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["param"] == "tokenpace.tier"
        assert '"tokenpace": {"ttft": 2, "tds": 10}' in err["message"]
        # and the form the message gives is accepted
        r = await c.post("/v1/chat/completions", json={**CHAT, "tokenpace": {"ttft": 2, "tds": 10}})
    assert r.status_code == 200, r.text
