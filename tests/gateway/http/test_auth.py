"""One authentication path (gateway/http/auth.py, gateway/http/gate.py): every route that
asks for a credential is refused without it, before its body is read and before the
request is validated, and the access table agrees with the OpenAPI document."""

from __future__ import annotations

import re

import pytest
from fastapi.routing import APIRoute

from gateway.http.auth import Access, access_rule
from tests.support.fake_upstream import upstream
from tests.support.gateway import backend_entry, gateway, make_config

ADMIN = "admin-key-0000001"
METRICS = "metrics-token-000001"


@pytest.fixture
async def gw():
    async with upstream() as fake:
        config = make_config(
            [backend_entry(fake, "a")], admin={"key": ADMIN}, metrics={"token": METRICS}
        )
        async with gateway(config) as gw:
            yield gw


def _concrete(path: str) -> str:
    """A route's path with its parameters filled in (a key id is 64 hex digits)."""
    path = path.replace("{key_id}", "0" * 64)
    return re.sub(r"\{[^}]+\}", "acme", path)


async def test_every_route_that_asks_for_a_credential_refuses_none(gw) -> None:
    routes = [r for r in gw.app.routes if isinstance(r, APIRoute) and access_rule(r.path)]
    assert len(routes) >= 10  # the API, telemetry, QoE, admin and /metrics
    big = b"{" * 100_000  # past every body limit (64 KiB): a 401 says it was never read
    async with gw.client(key="") as anon, gw.client(key="tp-not-a-key-0001") as wrong:
        for route in routes:
            path = _concrete(route.path)
            # a report without a key may carry its token in its body: that body is read
            report = access_rule(route.path) is Access.REPORT
            for method in route.methods:
                for client, body in ((anon, b"{}" if report else big), (wrong, big)):
                    r = await client.request(method, path, content=body)
                    assert r.status_code == 401, (method, route.path, r.text)
                    assert r.json()["error"]["code"] == "invalid_api_key"


async def test_unauthenticated_and_malformed_is_401_on_every_kind_of_route(gw) -> None:
    async with gw.client(key="") as anon, gw.client() as acme:
        assert (await acme.get("/v1/tokenpace/qoe", params={"window": 0})).status_code == 400
        assert (await anon.get("/v1/tokenpace/qoe", params={"window": 0})).status_code == 401
        bad = {"model": 7}
        assert (await acme.post("/v1/chat/completions", json=bad)).status_code == 400
        assert (await anon.post("/v1/chat/completions", json=bad)).status_code == 401
        path = "/v1/tokenpace/admin/tenants/acme/keys/not-a-digest"
        async with gw.client(key=ADMIN) as admin:
            assert (await admin.delete(path)).status_code == 400
        assert (await acme.delete(path)).status_code == 401


async def test_each_credential_opens_its_own_routes_only(gw) -> None:
    async with (
        gw.client() as acme,
        gw.client(key=ADMIN) as admin,
        gw.client(key=METRICS) as scraper,
    ):
        assert (await acme.get("/v1/models")).status_code == 200
        assert (await admin.get("/v1/models")).status_code == 401
        assert (await admin.get("/v1/tokenpace/admin/tenants")).status_code == 200
        assert (await acme.get("/v1/tokenpace/admin/tenants")).status_code == 401
        assert (await scraper.get("/metrics")).status_code == 200
        assert (await acme.get("/metrics")).status_code == 401
        # the QoE summary takes either: a tenant its own, the operator anyone's
        assert (await acme.get("/v1/tokenpace/qoe")).json()["tenants"].keys() == {"acme"}
        r = await acme.get("/v1/tokenpace/qoe", params={"tenant": "basic"})
        assert r.status_code == 403
        assert (await admin.get("/v1/tokenpace/qoe", params={"tenant": "basic"})).status_code == 200
        r = await admin.get("/v1/tokenpace/qoe", params={"tenant": "nobody"})  # was 200, empty
        assert r.status_code == 404 and r.json()["error"]["code"] == "tenant_not_found"
        assert (await scraper.get("/healthz")).status_code == 200  # public


async def test_the_access_table_matches_the_documented_security(gw) -> None:
    async with gw.client(key="") as anon:
        document = (await anon.get("/openapi.json")).json()
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            schemes = {name for req in op.get("security", []) for name in req}
            rule = access_rule(path)
            expected = {
                None: set(),
                Access.METRICS: set(),
                Access.TENANT: {"TenantKey"},
                Access.REPORT: {"TenantKey"},
                Access.ADMIN: {"AdminKey"},
                Access.TENANT_OR_ADMIN: set(),
            }[rule]
            assert schemes == expected, (method, path, rule)
    assert access_rule("/healthz") is None and access_rule("/v1/embeddings") is None
