"""Stopping a gateway (SIGTERM) drains it: ``tokenpace serve`` as a process, one worker
and ``--workers 2`` on a real ``redis-server``, in front of
``bench/fixed_rate_upstream.py`` (a stand-in for vLLM streaming 20 tokens a second).

New connections are refused at once; a stream that ends within ``server.drain_s`` ends as
it would have; one still open then ends with a ``server_shutting_down`` error event and
``[DONE]``; a request not yet answered gets 503 with that code as JSON; the access log
says so rather than blaming the client; the process exits.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.fake_upstream import upstream
from tests.support.gateway import KEY, backend_entry, gateway, make_config
from tests.support.process import KEY as PROCESS_KEY
from tests.support.process import Process, gateway_process, upstream_process
from tests.support.redis_server import RedisServer

DRAIN_S = 3.0
AUTH = {"Authorization": f"Bearer {PROCESS_KEY}"}


def chat(tokens: int, stream: bool = True) -> dict:
    body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return {**body, "max_tokens": tokens}


@pytest.fixture(params=[1, 2], ids=["one-process", "two-workers"])
def served(request) -> Iterator[Process]:
    redis = RedisServer().start()
    up = upstream_process(rate=20.0).start()
    gw = gateway_process(
        up.url,
        log_level="INFO",
        server={"drain_s": DRAIN_S},
        store={"redis_url": redis.url, "key_prefix": "drain"},
    )
    if request.param > 1:
        gw.args += ["--workers", str(request.param)]
    try:
        gw.start(timeout=30)
        yield gw
    finally:
        gw.stop()
        up.stop()
        redis.stop()


async def stream_events(client: httpx.AsyncClient, tokens: int, started: asyncio.Event) -> list:
    out: list = []
    async with client.stream("POST", "/v1/chat/completions", json=chat(tokens)) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                data = line[6:]
                out.append(data if data == "[DONE]" else json.loads(data))
                if len(out) == 3:
                    started.set()
    return out


async def test_sigterm_drains_streams_and_requests_then_exits(served: Process) -> None:
    gw = served
    assert gw.proc is not None
    async with httpx.AsyncClient(base_url=gw.url, headers=AUTH, timeout=30) as client:
        short_started, long_started = asyncio.Event(), asyncio.Event()
        short = asyncio.create_task(stream_events(client, 30, short_started))  # 1.5 s
        long = asyncio.create_task(stream_events(client, 400, long_started))  # 20 s
        whole = asyncio.create_task(client.post("/v1/chat/completions", json=chat(400, False)))
        await asyncio.wait_for(asyncio.gather(short_started.wait(), long_started.wait()), 10)
        await asyncio.sleep(0.2)  # the whole response is under way too
        gw.proc.send_signal(signal.SIGTERM)
        stopped_at = time.monotonic()

        await asyncio.sleep(0.5)
        with pytest.raises(httpx.ConnectError):  # not accepted: /readyz fails too
            await client.get("/readyz")

        finished = await asyncio.wait_for(short, 10)
        cut = await asyncio.wait_for(long, DRAIN_S + 10)
        answered = await asyncio.wait_for(whole, DRAIN_S + 10)
        ended_at = time.monotonic()

    # the short stream ended as it would have
    assert finished[-1] == "[DONE]" and "error" not in finished[-2]
    assert sum(1 for e in finished if isinstance(e, dict) and e["choices"]) >= 30
    # the long one at the drain's end, with OpenAI's error shape, then [DONE]
    assert cut[-1] == "[DONE]"
    assert cut[-2]["error"]["code"] == "server_shutting_down", cut[-2]
    assert cut[-2]["error"]["type"] == "server_error"
    assert DRAIN_S - 0.5 < ended_at - stopped_at < DRAIN_S + 4
    # the whole response: JSON, not a text/plain 500
    assert answered.status_code == 503
    assert answered.headers["content-type"] == "application/json"
    assert answered.json()["error"]["code"] == "server_shutting_down"
    assert int(answered.headers["retry-after"]) >= 1

    # uvicorn raises the signal again once it has shut down gracefully: killed by it
    assert gw.proc.wait(15) in (0, -signal.SIGTERM)
    log = [line for line in gw.output().splitlines() if "request finished" in line]
    assert len(log) == 3, log
    assert "outcome=aborted" not in "\n".join(log)  # nobody blames the client
    assert sum("outcome=completed" in line for line in log) == 1
    assert sum("status=200" in line and "outcome=error" in line for line in log) == 1
    assert sum("status=503" in line for line in log) == 1


async def test_readyz_fails_while_draining() -> None:
    async with (
        upstream() as fake,
        gateway(make_config([backend_entry(fake, "up")])) as gw,
        gw.client(KEY) as c,
    ):
        assert (await c.get("/readyz")).status_code == 200
        gw.state.drain.begin()
        r = await c.get("/readyz")
        assert r.status_code == 503 and r.json()["status"] == "draining"


def test_a_drain_of_zero_ends_streams_at_once() -> None:
    """``server.drain_s: 0`` is uvicorn's old behaviour, with the error event kept."""
    up = upstream_process(rate=20.0).start()
    gw = gateway_process(up.url, server={"drain_s": 0})
    try:
        gw.start()
        assert gw.proc is not None
        with httpx.stream(
            "POST", f"{gw.url}/v1/chat/completions", json=chat(400), headers=AUTH, timeout=10
        ) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            gw.proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]" and "server_shutting_down" in rest[-2]
        assert gw.proc.wait(10) in (0, -signal.SIGTERM)
    except subprocess.TimeoutExpired:
        pytest.fail("the gateway did not exit")
    finally:
        gw.stop()
        up.stop()
