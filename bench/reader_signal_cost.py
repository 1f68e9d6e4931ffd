"""What one reader signal costs the gateway: CPU per accepted and per refused update.

In process: the gateway's whole ASGI app (middleware, the access gate, the route, the
checks, the store's publish and this replica's own delivery to the stream it relays),
called directly with a prepared request, so no HTTP client or server is counted; the
memory store (one replica). One stream is held open on the embedded engine (its relay is
registered, so each accepted signal also reaches a relay and the engine's table), and
its client sends, in turn:

- ``accepted``: signals that change presence each time (watching/away, with a buffer),
  every one accepted and published;
- ``refused``: the abusive client of the feature's target, "visible, buffer empty" over
  and over, faster than ``qos.signals.MIN_INTERVAL_S``: answered 429, but for one
  accepted each interval (the share answered 429 is reported);
- ``floor``: ``GET /healthz`` through the same app, the cost of any request there (the
  middleware, the router, a response), for scale.

Each is measured as ``time.process_time()`` over ``--updates`` calls, ``--repeats``
times (the kinds interleaved), with the API key and with the telemetry token (the token
is an HMAC per call; the key a digest and a cache lookup). Target: <= 0.1 ms CPU per
update. Reported: the median over repeats and the worst repeat, per kind.

    .venv/bin/python bench/reader_signal_cost.py --updates 5000 --repeats 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.app import create_app  # noqa: E402
from gateway.config.loader import demo_config  # noqa: E402
from gateway.config.schema import DEMO_MODEL  # noqa: E402
from gateway.telemetry.tokens import TOKEN_HEADER  # noqa: E402

TARGET_MS = 0.1
Message = dict[str, Any]


def request_scope(path: str, headers: dict[str, str], body: bytes) -> dict[str, Any]:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    raw += [(b"content-length", str(len(body)).encode()), (b"host", b"bench")]
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": raw,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
        "state": {},
    }


async def call(
    app: Any, path: str, headers: dict[str, str], body: bytes, method: str = "POST"
) -> int:
    """One request through the app; its status."""
    sent = False
    status = 0

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)  # never disconnects
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app({**request_scope(path, headers, body), "method": method}, receive, send)
    return status


Sender = Callable[[int], Awaitable[int]]


async def open_stream(app: Any, key: str) -> tuple[str, str, asyncio.Task[None]]:
    """A long stream on the embedded engine, held open: its request id, its telemetry
    token and the task relaying it."""
    started: asyncio.Future[tuple[str, str]] = asyncio.get_running_loop().create_future()
    body = json.dumps(
        {
            "model": DEMO_MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "max_tokens": 4000,
        }
    ).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    async def receive() -> Message:
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start" and not started.done():
            h = {k.decode().lower(): v.decode() for k, v in message["headers"]}
            started.set_result((h["x-request-id"], h[TOKEN_HEADER.lower()]))

    async def run() -> None:
        scope = request_scope("/v1/chat/completions", headers, body)
        sent = False

        async def first() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await app(scope, first, send)

    task = asyncio.get_running_loop().create_task(run())
    rid, token = await asyncio.wait_for(started, 10)
    return rid, token, task


def senders(app: Any, key: str, rid: str, token: str) -> dict[str, Sender]:
    path = "/v1/tokenpace/reader"
    by_key = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    by_token = {TOKEN_HEADER: token, "Content-Type": "application/json"}
    presences = [
        json.dumps({"request_id": rid, "presence": p, "buffer_tokens": 3}).encode()
        for p in ("away", "watching")
    ]
    abusive = json.dumps({"request_id": rid, "presence": "watching", "buffer_tokens": 0}).encode()

    def accepted(headers: dict[str, str]) -> Sender:
        async def one(i: int) -> int:
            return await call(app, path, headers, presences[i % 2])

        return one

    def refused(headers: dict[str, str]) -> Sender:
        async def one(i: int) -> int:
            return await call(app, path, headers, abusive)

        return one

    async def floor(i: int) -> int:
        return await call(app, "/healthz", {}, b"", "GET")

    return {
        "floor (GET /healthz)": floor,
        "accepted/key": accepted(by_key),
        "refused/key": refused(by_key),
        "accepted/token": accepted(by_token),
        "refused/token": refused(by_token),
    }


async def measure(send: Sender, updates: int, expect: int) -> tuple[float, float]:
    """CPU ms per update over ``updates`` calls, and the share answered ``expect``
    (every other answer must be 202: an abusive client's signal past the interval is
    accepted, at most one every ``MIN_INTERVAL_S``)."""
    answered = 0
    cpu = time.process_time()
    for i in range(updates):
        status = await send(i)
        if status == expect:
            answered += 1
        elif status != 202:
            raise AssertionError(f"answered {status}, expected {expect}")
    return (time.process_time() - cpu) * 1000.0 / updates, answered / updates


async def main(updates: int, repeats: int) -> dict[str, Any]:
    config, key = demo_config(
        backends=[
            {
                "name": "embedded",
                "kind": "embedded",
                "models": [DEMO_MODEL],
                "options": {"time_scale": 0.05},  # the stream outlives the bench
            }
        ]
    )
    app = create_app(config)
    results: dict[str, list[float]] = {}
    shares: dict[str, list[float]] = {}  # of the calls, those answered as the kind expects
    async with app.router.lifespan_context(app):
        rid, token, stream = await open_stream(app, key)
        kinds = senders(app, key, rid, token)
        await kinds["accepted/key"](0)  # warm up: the owner looked up once; now away
        await kinds["accepted/key"](1)  # ... and watching: every accepted run starts away
        await asyncio.sleep(0.3)
        for r in range(repeats):
            order = list(kinds.items())
            for name, send in order if r % 2 == 0 else reversed(order):
                expect = {"accepted": 202, "refused": 429}.get(name.split("/")[0], 200)
                # an accepted run (an even count) ends where it began, watching: the
                # abusive "watching" is refused from its first call
                cpu_ms, share = await measure(send, updates, expect)
                results.setdefault(name, []).append(cpu_ms)
                shares.setdefault(name, []).append(share)
        stream.cancel()
    return {
        "updates": updates,
        "repeats": repeats,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"python {platform.python_version()}",
        "cpu_ms_per_update": {
            name: {
                "median": statistics.median(v),
                "max": max(v),
                "runs": v,
                "answered_as_expected": min(shares[name]),
            }
            for name, v in results.items()
        },
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    if args.updates % 2:
        parser.error("--updates must be even (the accepted runs alternate away and watching)")
    out = asyncio.run(main(args.updates, args.repeats))
    print(f"target <= {TARGET_MS} ms CPU per update; {out['machine']}")
    print(f"{'kind':<22} {'median ms':>10} {'worst ms':>10} {'as expected':>12}")
    for name, r in out["cpu_ms_per_update"].items():
        share = r["answered_as_expected"]
        print(f"{name:<22} {r['median']:>10.4f} {r['max']:>10.4f} {share:>12.1%}")
    if args.out:
        args.out.write_text(json.dumps(out, indent=2))
