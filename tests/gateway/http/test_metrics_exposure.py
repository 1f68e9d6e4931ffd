"""Who may read /metrics: a metrics token, when one is configured (its own port: see
tests/gateway/test_faults.py, which runs the gateway as a process)."""

from __future__ import annotations

from tests.support.fake_upstream import upstream
from tests.support.gateway import backend_entry, gateway, make_config

TOKEN = "metrics-token-000001"


async def test_metrics_token_is_required_when_set() -> None:
    async with (
        upstream() as fake,
        gateway(make_config([backend_entry(fake, "a")], metrics={"token": TOKEN})) as gw,
    ):
        async with gw.client(key="") as anon, gw.client(key="wrong-token-0001") as wrong:
            for c in (anon, wrong):
                r = await c.get("/metrics")
                assert r.status_code == 401
                assert r.json()["error"]["code"] == "invalid_api_key"
                assert "tokenpace_" not in r.text
        async with gw.client(key=TOKEN) as ok:
            r = await ok.get("/metrics")
            assert r.status_code == 200 and "tokenpace_requests" in r.text
            assert (await ok.get("/healthz")).status_code == 200
