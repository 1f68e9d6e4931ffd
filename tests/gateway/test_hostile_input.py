"""What one tenant's hostile input may cost, against real processes: ``tokenpace serve``
(text logs at INFO) on a real ``redis-server``, in front of ``bench/fixed_rate_upstream.py``
(a stand-in for vLLM), with raw sockets and httpx as clients.

Field lengths and the log (no forged line, no amplification), failed requests charged to
the tenant's rate limit, the plan's range of custom expectations, bodies whose parse the
gateway bounds, and HTTP/1.0 framing.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.process import KEY, Process, gateway_process, upstream_process
from tests.support.redis_server import RedisServer

CAPPED = "tp-hostile-capped-0001"  # 5 requests a minute
READER = "tp-hostile-reader-0002"  # chat and voice, custom expectations in their range
LAB = "tp-hostile-lab-00000003"  # chat only, custom expectations with a range of its own
SMALL = "tp-hostile-small-00004"  # 16 KiB bodies, 8 messages
TENANTS = [
    {"name": "acme", "api_keys": [KEY]},
    {"name": "capped", "api_keys": [CAPPED], "requests_per_minute": 5},
    {"name": "reader", "api_keys": [READER], "tiers": ["chat", "voice"], "allow_custom": True},
    {
        "name": "lab",
        "api_keys": [LAB],
        "tiers": ["chat"],
        "allow_custom": True,
        "custom_tier_limits": {"ttft_min": 0.0, "tds_max": 1000.0},
    },
    {"name": "small", "api_keys": [SMALL], "max_body_bytes": 16384, "max_messages": 8},
]
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d (DEBUG|INFO|WARNING|ERROR) ")


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def chat(model: str = "bench", tokens: int = 3, stream: bool = False, **extra: object) -> dict:
    messages = [{"role": "user", "content": "hi"}]
    return {"model": model, "messages": messages, "max_tokens": tokens, "stream": stream, **extra}


@pytest.fixture(scope="module")
def gw() -> Iterator[Process]:
    redis = RedisServer().start()
    up = upstream_process(rate=100.0).start()
    gateway = gateway_process(
        up.url,
        log_level="INFO",
        tenants=TENANTS,
        store={"redis_url": redis.url, "key_prefix": "hostile"},
    )
    try:
        gateway.start()
        yield gateway
    finally:
        gateway.stop()
        up.stop()
        redis.stop()


async def post(gw: Process, key: str, body: object, **kwargs: object) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gw.url, headers=auth(key), timeout=20) as c:
        return await c.post("/v1/chat/completions", json=body, **kwargs)  # type: ignore[arg-type]


async def test_a_model_name_cannot_forge_a_log_line_nor_amplify_the_log(gw: Process) -> None:
    forged = "nope\n2026-01-01T00:00:00 INFO    [-] FORGED request finished tenant=admin"
    r = await post(gw, KEY, chat(forged))
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    huge = "m" * 3_000_000  # 3 MB of model name: 3 MB of log and of 404 body before
    r = await post(gw, KEY, chat(huge))
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert len(r.content) < 1000
    await asyncio.sleep(0.5)  # the access log is written as the response ends
    lines = gw.output().splitlines()
    assert not [line for line in lines if "FORGED" in line and not LOG_LINE.match(line)]
    (access,) = [line for line in lines if "FORGED" in line]
    assert 'model="nope\\n2026-01-01T00:00:00 INFO    [-] FORGED' in access
    assert "status=404" in access
    assert max(len(line) for line in lines) < 10_000  # the 3 MB name is nowhere


async def test_failed_requests_count_against_the_tenants_rate_limit(gw: Process) -> None:
    """A tenant limited to 5 requests a minute wrote 30 MB of log with 404s."""
    statuses = [(await post(gw, CAPPED, chat("no-such-model"))).status_code for _ in range(5)]
    assert statuses == [404] * 5
    r = await post(gw, CAPPED, chat("no-such-model"))
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_requests"
    assert int(r.headers["retry-after"]) >= 1
    assert r.headers["x-ratelimit-limit-requests"] == "5"
    # the window is the one admission counts: a good request waits for it too
    assert (await post(gw, CAPPED, chat())).status_code == 429
    assert (await post(gw, KEY, chat())).status_code == 200  # another tenant's is its own


async def test_custom_expectations_stay_within_the_plan(gw: Process) -> None:
    for numbers, param in (({"ttft": 0}, "tokenpace.ttft"), ({"tds": 1000}, "tokenpace.tds")):
        r = await post(gw, READER, chat(tokenpace=numbers))
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param
        assert "your plan's range" in r.json()["error"]["message"]
    r = await post(gw, READER, chat(tokenpace={"ttft": 2, "tds": 3}))  # a slower reader
    assert r.status_code == 200 and r.headers["x-tokenpace-tds"] == "3.0"
    r = await post(gw, LAB, chat(tokenpace={"ttft": 0, "tds": 1000}))  # its own range
    assert r.status_code == 200 and r.headers["x-tokenpace-tds"] == "1000.0"


async def test_bodies_the_plan_does_not_allow_are_refused_before_they_are_parsed(
    gw: Process,
) -> None:
    many = chat() | {"messages": [{"role": "user", "content": "hi"}] * 120_000}  # 4 MB
    started = time.monotonic()
    r = await post(gw, KEY, many)
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_messages"
    assert time.monotonic() - started < 5.0
    r = await post(gw, SMALL, chat() | {"messages": [{"role": "user", "content": "hi"}] * 9})
    assert r.status_code == 400 and "at most 8" in r.json()["error"]["message"]
    r = await post(gw, SMALL, chat() | {"messages": [{"role": "user", "content": "x" * 20000}]})
    assert r.status_code == 413 and "16384" in r.json()["error"]["message"]
    assert (
        await post(gw, KEY, chat() | {"messages": [{"role": "user", "content": "x" * 20000}]})
    ).status_code == 200


async def exchange(gw: Process, request: bytes) -> tuple[str, list[tuple[str, str]], bytes]:
    """Send ``request`` on a new connection; the status line, headers and body until the
    server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(request)
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(-1), 20)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status, *fields = head.decode("latin-1").split("\r\n")
    headers = [(n.strip().lower(), v.strip()) for n, v in (f.split(":", 1) for f in fields)]
    return status, headers, body


def request(version: str, body: dict, key: str = KEY, close: bool = False) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/{version}\r\nHost: gateway\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n" + ("Connection: close\r\n" if close else "")
    )
    return head.encode() + b"\r\n" + payload


async def test_http10_clients_get_no_chunked_encoding_and_one_connection_header(
    gw: Process,
) -> None:
    status, headers, body = await exchange(gw, request("1.0", chat(tokens=5, stream=True)))
    assert status.split()[1] == "200"
    names = [n for n, _ in headers]
    assert "transfer-encoding" not in names  # RFC 9112 6.1: not to an HTTP/1.0 request
    assert [v for n, v in headers if n == "connection"] == ["close"]
    assert body.startswith(b"data: {") and body.endswith(b"data: [DONE]\n\n")  # no chunk sizes
    assert body.count(b'"content"') >= 5

    status, headers, body = await exchange(gw, request("1.0", chat(tokens=2)))
    assert [v for n, v in headers if n == "connection"] == ["close"]
    assert int(dict(headers)["content-length"]) == len(body)
    assert json.loads(body)["object"] == "chat.completion"

    # HTTP/1.1 closing after the stream: the server's "close", not also "keep-alive"
    status, headers, body = await exchange(
        gw, request("1.1", chat(tokens=2, stream=True), close=True)
    )
    assert [v for n, v in headers if n == "connection"] == ["close"]
    assert dict(headers)["transfer-encoding"] == "chunked"


def nested(levels: int) -> bytes:
    """``levels`` of arrays in one field: a few bytes a level."""
    return b'{"x": ' + b"[" * (levels - 1) + b"]" * (levels - 1) + b"}"


async def test_deep_json_is_a_400_before_parsing_with_one_log_line(gw: Process) -> None:
    """A 300-level report without a credential was a 500 and 3.8 KB of tracebacks
    (orjson writing it); a chat body of 1,000+ levels a 500 or a dropped connection
    (msgspec's RecursionError)."""
    before = len(gw.output().splitlines())
    deep_chat = json.dumps(chat()).encode()[:-1] + b', "metadata": ' + nested(1200) + b"}"
    report = b'{"telemetry_token": "tpt1.x.y", "deep": ' + nested(300) + b"}"
    async with httpx.AsyncClient(base_url=gw.url, timeout=20) as c:
        answers = [
            await c.post("/v1/chat/completions", content=deep_chat, headers=auth(KEY)),
            await c.post("/v1/tokenpace/telemetry", content=report),  # no credential
            await c.post("/v1/tokenpace/telemetry", content=report, headers=auth(KEY)),
            await c.post(
                "/v1/tokenpace/telemetry",
                content=report,
                headers={"Content-Type": "text/plain"},  # a beacon's
            ),
        ]
    for r in answers:
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "invalid_json" and "at most 254" in error["message"]
    await asyncio.sleep(0.5)  # the access log is written as the response ends
    lines = gw.output().splitlines()[before:]
    assert all(LOG_LINE.match(line) for line in lines), lines  # no traceback
    assert len([line for line in lines if "error_code=invalid_json" in line]) == len(answers)
    assert (await post(gw, KEY, chat())).status_code == 200


async def test_a_body_that_is_not_utf8_is_invalid_json(gw: Process) -> None:
    body = json.dumps(chat()).encode().replace(b'"hi"', b'"\xff\xfe"')
    async with httpx.AsyncClient(base_url=gw.url, headers=auth(KEY), timeout=20) as c:
        r = await c.post("/v1/chat/completions", content=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_json"
