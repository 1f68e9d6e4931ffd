"""A backend that refuses the gateway's own credentials (HTTP 401 or 403): the client,
whose key the gateway accepted, gets 502 naming the backend and what to fix in the
gateway's configuration, never the upstream's "invalid API key" as if its key were
wrong; another backend still serves the request (failover)."""

from __future__ import annotations

import httpx
import pytest

from tests.support.fake_upstream import MODEL, upstream
from tests.support.gateway import KEY, backend_entry, gateway, make_config

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.mark.parametrize("status", [401, 403])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_refused_backend_is_a_502_naming_it(status: int, stream: bool) -> None:
    async with upstream() as fake, gateway(make_config([backend_entry(fake, "vllm-a")])) as gw:
        fake.mode = f"http_{status}"
        async with httpx.AsyncClient(base_url=gw.base_url, timeout=10) as client:
            r = await client.post(
                "/chat/completions",
                json={**CHAT, "stream": stream},
                headers={"Authorization": f"Bearer {KEY}"},
            )
    assert r.status_code == 502, r.text
    err = r.json()["error"]
    assert err["code"] == "upstream_auth_failed" and err["type"] == "upstream_error"
    assert f"Backend 'vllm-a' refused the gateway's credentials (HTTP {status}" in err["message"]
    assert "backends[].api_key" in err["message"]
    assert "the client's API key is not the cause" in err["message"]


async def test_another_backend_serves_when_one_refuses_the_gateway() -> None:
    async with upstream() as refusing, upstream() as good:
        config = make_config([backend_entry(refusing, "a"), backend_entry(good, "b")])
        async with gateway(config) as gw:
            refusing.mode = "http_401"
            async with httpx.AsyncClient(base_url=gw.base_url, timeout=10) as client:
                for n in range(8):  # conversations of their own: some prefer either backend
                    body = {**CHAT, "messages": [{"role": "user", "content": f"hi {n}"}]}
                    r = await client.post(
                        "/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}
                    )
                    assert r.status_code == 200, r.text
    assert len(good.bodies) == 8 and refusing.bodies  # refused at least once, failed over
