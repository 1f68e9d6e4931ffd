"""The gateway's web pages (/demo, /dashboard, /docs and their assets) and the dashboard's
status document. The built pages themselves run in Chromium: webui/test/ (the policy
and the framing too)."""

from __future__ import annotations

import asyncio
import re

import pytest

from gateway.http.pages import WEBUI_DIR_ENV, is_built, webui_dir
from tests.support.fake_upstream import MODEL, upstream
from tests.support.gateway import KEY, backend_entry, gateway, make_config

ADMIN = "admin-key-0000001"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.fixture
def webui(tmp_path, monkeypatch):
    monkeypatch.setenv(WEBUI_DIR_ENV, str(tmp_path))
    return tmp_path


async def test_pages_and_assets_are_served_with_a_charset(webui) -> None:
    (webui / "demo.html").write_text("<!doctype html><title>デモ</title>", encoding="utf-8")
    (webui / "dashboard.html").write_text("<!doctype html><title>board</title>")
    (webui / "demo.js").write_text("console.log('é');", encoding="utf-8")
    async with (
        upstream() as fake,
        gateway(make_config([backend_entry(fake, "up")])) as gw,
        gw.client("") as c,
    ):
        r = await c.get("/demo")
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/html; charset=utf-8"
        assert "デモ" in r.text
        assert (await c.get("/dashboard")).text.endswith("board</title>")
        js = await c.get("/webui/demo.js")
        assert js.status_code == 200 and "javascript" in js.headers["content-type"]
        assert (await c.get("/webui/missing.js")).status_code == 404
        assert (await c.get("/webui/../pyproject.toml")).status_code == 404


async def test_pages_forbid_framing_and_code_from_elsewhere(webui) -> None:
    for name in ("demo.html", "dashboard.html", "docs.html"):
        (webui / name).write_text("<!doctype html><title>page</title>")
    async with (
        upstream() as fake,
        gateway(make_config([backend_entry(fake, "up")])) as gw,
        gw.client("") as c,
    ):
        for path in ("/demo", "/dashboard", "/docs"):
            r = await c.get(path)
            assert r.status_code == 200, path
            policy = r.headers["content-security-policy"]
            assert "frame-ancestors 'none'" in policy and "script-src 'self';" in policy
            assert "default-src 'none'" in policy
            assert r.headers["x-frame-options"] == "DENY"
            assert r.headers["x-content-type-options"] == "nosniff"
        # every response, an API error included, is only what its type says
        assert (await c.get("/v1/models")).headers["x-content-type-options"] == "nosniff"
        assert (await c.get("/redoc")).status_code == 404  # ReDoc loaded its code from a CDN
    async with (
        upstream() as fake,
        gateway(make_config([backend_entry(fake, "up")], server={"docs": False})) as gw,
        gw.client("") as c,
    ):
        assert (await c.get("/docs")).status_code == 404
        assert (await c.get("/openapi.json")).status_code == 404


def test_the_built_docs_page_loads_swagger_ui_from_the_gateway() -> None:
    """What `make webui` builds: /docs loads Swagger UI from /webui/, nothing from a CDN."""
    dist = webui_dir()
    if not is_built(dist):
        pytest.fail("webui/dist is not built: run `make webui`")
    html = (dist / "docs.html").read_text()
    scripts = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert scripts and all(s.startswith("/webui/") for s in scripts), scripts
    assert (dist / "swagger-ui-bundle.js").is_file() and (dist / "swagger-ui.css").is_file()


async def test_an_unbuilt_ui_says_how_to_build_it(webui) -> None:
    async with (
        upstream() as fake,
        gateway(make_config([backend_entry(fake, "up")])) as gw,
        gw.client("") as c,
    ):
        r = await c.get("/demo")
        assert r.status_code == 503
        error = r.json()["error"]
        assert error["code"] == "webui_not_built" and "make webui" in error["message"]
        assert str(webui) not in r.text  # no path of the server's to an unauthenticated caller


async def test_admin_status_shows_backends_load_and_fair_share() -> None:
    async with upstream() as fake:
        config = make_config([backend_entry(fake, "up")], admin={"key": ADMIN})
        async with gateway(config) as gw:
            async with gw.client(KEY) as tenant, gw.client(ADMIN) as admin:
                assert (await tenant.get("/v1/tokenpace/admin/status")).status_code == 401
                r = await tenant.post("/v1/chat/completions", json=CHAT)
                assert r.status_code == 200
                assert (await tenant.get("/v1/models")).status_code == 200  # not a completion
                await asyncio.sleep(0.1)  # output tokens are charged in batches
                status = (await admin.get("/v1/tokenpace/admin/status")).json()
            assert status["ready"] is True
            assert status["backends"][0]["name"] == "up" and status["backends"][0]["healthy"]
            assert status["requests_in_flight"] == 0 and status["requests_queued"] == 0
            assert status["readers"] == {"watching": 0, "away": 0, "pace_away_tps": 0.0}
            acme = status["tenants"]["acme"]
            assert acme["weight"] == 2.0 and acme["requests"] == 1
            assert acme["output_tokens"] > 0 and acme["vtc_counter"] > 0
            assert status["tenants"]["basic"]["output_tokens"] == 0


async def test_admin_history_keeps_the_load_every_two_seconds() -> None:
    """The dashboard's charts on open: a sample at start, then one every 2 s (real time)."""
    async with upstream() as fake:
        config = make_config([backend_entry(fake, "up")], admin={"key": ADMIN})
        async with gateway(config) as gw, gw.client(KEY) as tenant, gw.client(ADMIN) as admin:
            url = "/v1/tokenpace/admin/history"
            assert (await tenant.get(url)).status_code == 401
            assert (await admin.get(url, params={"seconds": 0})).status_code == 400
            assert (await admin.get(url, params={"seconds": 1801})).status_code == 400
            first = (await admin.get(url)).json()
            assert first["object"] == "tokenpace.history" and first["interval_s"] == 2.0
            (start,) = first["samples"]  # taken as the gateway started
            assert start["tenants"] == {
                "acme": {"output_tokens": 0, "requests": 0},
                "basic": {"output_tokens": 0, "requests": 0},
            }
            assert (start["requests_in_flight"], start["requests_queued"]) == (0, 0)
            assert (await tenant.post("/v1/chat/completions", json=CHAT)).status_code == 200

            samples: list[dict] = first["samples"]
            deadline = asyncio.get_running_loop().time() + 5.0
            while len(samples) < 2 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.1)
                samples = (await admin.get(url, params={"seconds": 60})).json()["samples"]
            assert len(samples) >= 2, samples
            later = samples[-1]
            assert 1.5 <= later["time"] - start["time"] <= 4.0  # every 2 s, on a loaded machine
            assert later["tenants"]["acme"]["requests"] == 1
            assert later["tenants"]["acme"]["output_tokens"] > 0
            recent = (await admin.get(url, params={"seconds": 1})).json()["samples"]
            assert start not in recent  # only the last second's
