"""Bad input gets a clear OpenAI-shaped error, and the gateway keeps serving everyone.

Raw httpx against a real gateway; the upstream is the FakeUpstream stand-in for vLLM.
"""

from __future__ import annotations

import json
import logging

import pytest
import pytest_asyncio

from gateway.backends import InProcessBackend
from tests.support.fake_upstream import MODEL, upstream
from tests.support.gateway import KEY, KEY_BASIC, backend_entry, gateway, make_config
from tests.support.waiting import eventually

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


class EchoLike(InProcessBackend):
    async def generate(self, endpoint, body, ctx):  # pragma: no cover - never reached
        yield {}


# One upstream and one gateway for the whole module (start-up and shutdown cost ~0.5 s).
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def shared():
    async with (
        upstream() as fake,
        gateway(make_config([backend_entry(fake, "a", tokenpace=True)])) as gw,
        gw.client() as client,
    ):
        yield gw, fake, client


@pytest.fixture
def env(shared):
    _gw, fake, _client = shared
    fake.mode, fake.n_tokens = "ok", 6
    yield shared
    fake.mode, fake.n_tokens = "ok", 6


def assert_error(resp, status: int, *, param=None, code=None, contains=None) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    if contains is not None:
        assert contains in err["message"]
    assert resp.headers.get("x-request-id")
    return err


async def still_serving(client) -> None:
    r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": MODEL}, "messages", "missing_required_parameter"),
        ({"messages": CHAT["messages"]}, "model", "missing_required_parameter"),
        ({**CHAT, "messages": "hi"}, "messages", "invalid_type"),
        ({**CHAT, "messages": []}, "messages", "invalid_value"),
        ({**CHAT, "messages": [{"content": "no role"}]}, "messages[0].role", None),
        ({**CHAT, "max_tokens": "10"}, "max_tokens", "invalid_type"),
        ({**CHAT, "max_tokens": 0}, "max_tokens", "invalid_value"),
        ({**CHAT, "max_tokens": -5}, "max_tokens", "invalid_value"),
        ({**CHAT, "max_tokens": 10**12}, "max_tokens", "invalid_value"),
        ({**CHAT, "max_completion_tokens": 10**9}, "max_completion_tokens", "invalid_value"),
        ({**CHAT, "temperature": 7}, "temperature", "invalid_value"),
        ({**CHAT, "temperature": "hot"}, "temperature", "invalid_type"),
        ({**CHAT, "n": 0}, "n", "invalid_value"),
        ({**CHAT, "n": 1000}, "n", "invalid_value"),
        ({**CHAT, "stream": "yes"}, "stream", "invalid_type"),
        ({**CHAT, "stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
        ({**CHAT, "stop": 3}, "stop", "invalid_type"),
        ({**CHAT, "tokenpace": "voice"}, "tokenpace", None),
        ({**CHAT, "tokenpace": {"tier": "gold"}}, "tokenpace.tier", "unknown_tier"),
        ({**CHAT, "tokenpace": {"tiers": "chat"}}, "tokenpace.tiers", None),
        ({**CHAT, "tokenpace": {"ttft": -1}}, "tokenpace.ttft", None),
        ({**CHAT, "tokenpace": {"tds": 0}}, "tokenpace.tds", None),
        ({**CHAT, "tokenpace": {"tds": 1e9}}, "tokenpace.tds", None),
        ({**CHAT, "tokenpace": {"ttft": "fast"}}, "tokenpace.ttft", None),
    ],
)
async def test_bad_bodies_are_400(env, body, param, code):
    _gw, fake, client = env
    sent = len(fake.bodies)
    err = assert_error(
        await client.post("/v1/chat/completions", json=body), 400, param=param, code=code
    )
    assert err["type"] == "invalid_request_error"
    assert len(fake.bodies) == sent  # nothing reached the backend
    await still_serving(client)


async def test_malformed_json(env):
    _gw, _fake, client = env
    for raw in (b'{"model": "x", "messages": [', b"not json at all", b""):
        r = await client.post(
            "/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"}
        )
        err = assert_error(r, 400)
        assert "JSON" in err["message"] or "empty" in err["message"]
    r = await client.post(
        "/v1/chat/completions", content=b"[1, 2]", headers={"Content-Type": "application/json"}
    )
    assert_error(r, 400, contains="JSON object")
    await still_serving(client)


async def test_a_json_body_is_read_whatever_its_content_type(env):
    """As OpenAI's API: ``curl -d`` (form-encoded), text/plain or no Content-Type at all."""
    _gw, fake, client = env
    raw = json.dumps(CHAT).encode()
    for content_type in ("application/x-www-form-urlencoded", "text/plain", None):
        headers = {"Content-Type": content_type} if content_type else {}
        r = await client.post("/v1/chat/completions", content=raw, headers=headers)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"]
        assert fake.bodies[-1]["messages"] == CHAT["messages"]
    r = await client.post(
        "/v1/chat/completions",
        content=b"model=x&messages=y",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert_error(r, 400, code="invalid_json", contains="expects a JSON payload")


async def test_completions_validation(env):
    _gw, _fake, client = env
    r = await client.post("/v1/completions", json={"model": MODEL})
    assert_error(r, 400, param="prompt", code="missing_required_parameter")
    r = await client.post("/v1/completions", json={"model": MODEL, "prompt": {"a": 1}})
    assert_error(r, 400, param="prompt")


async def test_auth_errors(env):
    gw, _fake, client = env
    async with gw.client(key="") as anon:
        r = await anon.post("/v1/chat/completions", json=CHAT)
        assert_error(r, 401, code="invalid_api_key", contains="API key")
        assert r.headers["www-authenticate"] == "Bearer"
        r = await anon.post(
            "/v1/chat/completions", json=CHAT, headers={"Authorization": "Basic abc"}
        )
        assert_error(r, 401, code="invalid_api_key")
        r = await anon.post(
            "/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer wrong"}
        )
        assert_error(r, 401, code="invalid_api_key", contains="Incorrect API key")
        assert "wrong" not in r.text  # the key is not echoed
        # authentication comes first, also for a malformed body
        r = await anon.post(
            "/v1/chat/completions", content=b"{", headers={"Content-Type": "application/json"}
        )
        assert_error(r, 401)
        r = await anon.get("/v1/models")
        assert_error(r, 401)
    await still_serving(client)


async def test_error_answers_are_logged_with_their_code(env, caplog):
    """The access log line says why a request failed (its answer's code)."""
    _gw, _fake, client = env
    async with _gw.client(key="") as anon:
        cases = [
            (client.post("/v1/chat/completions", json={"model": MODEL}), 400, "missing_required"),
            (anon.post("/v1/chat/completions", json=CHAT), 401, "invalid_api_key"),
            (client.post("/v1/chat/completions", json={**CHAT, "model": "x"}), 404, "model_not"),
        ]
        with caplog.at_level(logging.INFO, "tokenpace.gateway.access"):
            for call, status, code in cases:
                r = await call
                assert r.status_code == status
                rid = r.headers["x-request-id"]

                def logged(rid: str = rid) -> list[logging.LogRecord]:
                    return [x for x in caplog.records if getattr(x, "request_id", "") == rid]

                assert await eventually(lambda: logged() != [])
                (line,) = logged()
                assert (line.status, line.outcome) == (status, "error")
                assert line.error_code.startswith(code)


async def test_tier_errors(env):
    _gw, _fake, client = env
    basic = {"Authorization": f"Bearer {KEY_BASIC}"}
    r = await client.post(
        "/v1/chat/completions", json=CHAT, headers={**basic, "X-TokenPace-Tier": "voice"}
    )
    err = assert_error(r, 403, param="X-TokenPace-Tier", code="tier_not_allowed")
    assert err["type"] == "permission_error"
    r = await client.post(
        "/v1/chat/completions", json=CHAT, headers={**basic, "X-TokenPace-Tier": "nope"}
    )
    assert_error(r, 400, param="X-TokenPace-Tier", code="unknown_tier")
    r = await client.post(
        "/v1/chat/completions", json={**CHAT, "tokenpace": {"ttft": 1, "tds": 2}}, headers=basic
    )
    assert_error(r, 403, param="tokenpace.ttft", code="custom_tier_not_allowed")
    # header and body must agree
    r = await client.post(
        "/v1/chat/completions",
        json={**CHAT, "tokenpace": {"tier": "chat"}},
        headers={"X-TokenPace-Tier": "voice"},
    )
    assert_error(r, 400, param="tokenpace.tier")
    r = await client.post(
        "/v1/chat/completions", json=CHAT, headers={**basic, "X-TokenPace-Tier": "batch"}
    )
    assert r.status_code == 200 and r.headers["x-tokenpace-tier"] == "batch"


async def test_unknown_model_is_404(env):
    _gw, _fake, client = env
    r = await client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-17"})
    err = assert_error(r, 404, param="model", code="model_not_found")
    assert err["message"] == "The model `gpt-17` does not exist or you do not have access to it."
    r = await client.post(
        "/v1/completions", json={"model": "gpt-17", "prompt": "x", "stream": True}
    )
    assert_error(r, 404, param="model", code="model_not_found")


async def test_unknown_route_and_method(env):
    _gw, _fake, client = env
    assert_error(await client.post("/v1/embeddings", json={}), 404, code="unknown_url")
    assert_error(await client.get("/v1/chat/completions"), 405, code="method_not_allowed")


async def test_oversized_body_is_413(env):
    _gw, _fake, client = env
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 70_000}]}
    r = await client.post("/v1/chat/completions", json=big)
    assert_error(r, 413, code="request_too_large")

    async def chunks():  # no Content-Length: the limit applies while reading
        for _ in range(20):
            yield b"x" * 8192

    r = await client.post(
        "/v1/chat/completions", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert_error(r, 413, code="request_too_large")
    await still_serving(client)


async def test_upstream_garbage_and_errors(env):
    _gw, fake, client = env
    fake.mode = "garbage"
    r = await client.post("/v1/chat/completions", json=CHAT)
    err = assert_error(r, 502, code="upstream_bad_response")
    assert err["type"] == "upstream_error"
    fake.mode = "http_400"  # the backend's 4xx, relayed with its own body
    r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 400 and r.json()["error"]["message"] == "fake upstream error 400"
    assert r.headers["x-tokenpace-tier"] == "chat"
    fake.mode = "ok"
    await still_serving(client)


async def test_other_requests_unaffected_by_a_broken_stream(env):
    """One client's stream breaking mid-way does not disturb a concurrent one."""
    import asyncio

    _gw, fake, client = env
    fake.n_tokens = 30
    body = {**CHAT, "stream": True}

    async def run() -> list[str]:
        async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            return [line async for line in resp.aiter_lines() if line.startswith("data:")]

    healthy = asyncio.create_task(run())
    await asyncio.sleep(0.03)
    fake.mode = "close_mid"
    broken = await run()
    fake.mode = "ok"
    assert '"error"' in broken[-2] and broken[-1] == "data: [DONE]"
    good = await healthy
    assert good[-1] == "data: [DONE]" and not any('"error"' in line for line in good)


async def test_models_and_key_for_other_tenant(env):
    _gw, _fake, client = env
    r = await client.get("/v1/models")
    assert r.status_code == 200
    assert r.json() == {
        "object": "list",
        "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "tokenpace"}],
    }
    assert KEY not in r.text


async def test_internal_error_is_openai_shaped():
    class Broken(EchoLike):
        def serves(self, model: str) -> bool:
            raise RuntimeError("bug")

    config = make_config([])
    async with gateway(config, backends=[Broken("broken", ["x"])]) as gw, gw.client() as client:
        r = await client.post("/v1/chat/completions", json=CHAT)
        err = assert_error(r, 500, code="internal_error")
        assert err["type"] == "server_error" and "bug" not in err["message"]
        assert (await client.get("/healthz")).status_code == 200


@pytest.mark.parametrize(
    ("raw", "param", "what"),
    [
        (b'"seed": 18446744073709551616', "seed", "64-bit"),
        (b'"logit_bias": {"50256": -100000000000000000000000}', "logit_bias.50256", "64-bit"),
        (b'"stop": ["\\ud800"]', "stop[0]", "surrogate"),
        (b'"metadata": {"x": "ok\\udfffok"}', "metadata.x", "surrogate"),
    ],
)
async def test_a_body_that_cannot_be_forwarded_is_a_400_not_a_failover(
    env, raw: bytes, param: str, what: str
) -> None:
    """Python's JSON parser accepts what orjson cannot write for the backend: the client's
    error, named, before any backend is tried (it was a 502 and a failover per backend)."""
    gw, fake, client = env
    sent = len(fake.bodies)
    failovers = gw.state.metrics.registry.get_sample_value(
        "tokenpace_failovers_total", {"backend": "a"}
    )
    body = b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "hi"}], '
    resp = await client.post(
        "/v1/chat/completions",
        content=body + raw + b"}",
        headers={"Content-Type": "application/json"},
    )
    err = assert_error(resp, 400, param=param, code="invalid_value", contains=what)
    assert err["type"] == "invalid_request_error"
    assert len(fake.bodies) == sent  # no backend saw it
    after = gw.state.metrics.registry.get_sample_value(
        "tokenpace_failovers_total", {"backend": "a"}
    )
    assert after == failovers
    assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
