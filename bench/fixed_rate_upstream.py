"""A minimal OpenAI-compatible streaming upstream that emits tokens at a fixed rate.

For gateway benchmarks (``bench/gateway_load.py``): it must cost as little as possible
per token, so it is a bare ASGI application under uvicorn (httptools, uvloop), and every
chunk is two pre-encoded byte strings around the one thing that changes, the stamp.

- ``GET /v1/models`` (also the health check), ``GET /health``.
- ``POST /v1/chat/completions``, streaming or not. A stream is a role chunk, then
  ``max_tokens`` (or ``max_completion_tokens``, default 200) content chunks, a finish
  chunk (``finish_reason: "length"``), the usage chunk when
  ``stream_options.include_usage`` is set, and ``data: [DONE]``.
- Each content chunk's ``content`` is its emission stamp: ``time.time_ns() // 1000``
  as decimal digits (microseconds since the epoch, 16 digits), taken just before the
  chunk is written. Proxies relay ``content`` unchanged, so a client on the same machine
  measures each chunk's delivery delay exactly: receive time minus the stamp.
- Rate: token ``k`` of a stream (k = 0, 1, ...) is due ``ttft + k / rate`` seconds after
  the request arrived (an absolute schedule: no drift). ``--rate`` is the default; a
  model named ``tps-R`` is served at R tokens/s instead, and ``tps-0`` as fast as
  possible (the stream yields to the event loop between chunks, so concurrent streams
  interleave).
- When the client disconnects the stream stops, as vLLM aborts a generation.

Run: ``python bench/fixed_rate_upstream.py --port 9000 --rate 50``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

DEFAULT_TOKENS = 200
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]
_JSON_HEADERS = [(b"content-type", b"application/json")]
_DONE = b"data: [DONE]\n\n"


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def stream_rate(model: str, default: float) -> float:
    """Tokens per second for a stream of ``model`` (``tps-R`` → R; 0 = unlimited)."""
    if model.startswith("tps-"):
        try:
            rate = float(model[4:])
        except ValueError:
            return default
        if rate >= 0:
            return rate
    return default


def _requested_tokens(body: dict[str, Any]) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return DEFAULT_TOKENS


class FixedRateUpstream:
    """The ASGI application (see the module docstring)."""

    def __init__(self, rate: float, ttft: float, models: list[str]) -> None:
        self.rate = rate
        self.ttft = ttft
        self.models_body = _dumps(
            {
                "object": "list",
                "data": [{"id": m, "object": "model", "owned_by": "bench"} for m in models],
            }
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if method == "GET" and path in ("/v1/models", "/health"):
            await _respond(send, 200, self.models_body)
        elif method == "POST" and path == "/v1/chat/completions":
            await self._chat(receive, send)
        else:
            await _respond(send, 404, _dumps({"error": {"message": "not found", "type": "x"}}))

    async def _chat(self, receive: Receive, send: Send) -> None:
        arrived = time.monotonic()
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body", False):
                break
        try:
            body = json.loads(raw)
        except ValueError:
            await _respond(send, 400, _dumps({"error": {"message": "bad json", "type": "x"}}))
            return
        model = str(body.get("model", "bench"))
        n = _requested_tokens(body)
        rate = stream_rate(model, self.rate)
        if not body.get("stream"):
            await asyncio.sleep(self.ttft + (n / rate if rate > 0 else 0.0))
            await _respond(send, 200, _completion(model, n))
            return
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        await self._stream(receive, send, model, n, rate, usage, arrived)

    async def _stream(
        self,
        receive: Receive,
        send: Send,
        model: str,
        n: int,
        rate: float,
        usage: bool,
        arrived: float,
    ) -> None:
        head = (
            f'{{"id":"chatcmpl-{uuid.uuid4().hex}","object":"chat.completion.chunk",'
            f'"created":{int(time.time())},"model":{json.dumps(model)},'
        ).encode()
        prefix = b"data: " + head + b'"choices":[{"index":0,"delta":{"content":"'
        suffix = b'"},"logprobs":null,"finish_reason":null}]}\n\n'
        role = (
            b"data: "
            + head
            + b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            + b'"logprobs":null,"finish_reason":null}]}\n\n'
        )
        finish = (
            b"data: "
            + head
            + b'"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]}\n\n'
        )
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            await send({"type": "http.response.body", "body": role, "more_body": True})
            start = arrived + self.ttft
            interval = 1.0 / rate if rate > 0 else 0.0
            clock = time.monotonic
            for k in range(n):
                if gone.done():
                    return
                wait = start + k * interval - clock()
                await asyncio.sleep(wait if wait > 0 else 0)
                chunk = prefix + b"%d" % (time.time_ns() // 1000) + suffix
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            tail = finish
            if usage:
                tail += (
                    b"data: "
                    + head
                    + b'"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":%d,'
                    b'"total_tokens":%d}}\n\n' % (n, n + 1)
                )
            await send({"type": "http.response.body", "body": tail + _DONE, "more_body": False})
        finally:
            gone.cancel()


def _completion(model: str, n: int) -> bytes:
    return _dumps(
        {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "tok " * n},
                    "logprobs": None,
                    "finish_reason": "length",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1},
        }
    )


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _respond(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": _JSON_HEADERS})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9000)
    p.add_argument("--rate", type=float, default=50.0, help="tokens/s per stream (0: unlimited)")
    p.add_argument("--ttft", type=float, default=0.0, help="seconds before the first token")
    p.add_argument("--models", default="bench,tps-0", help="comma-separated names for /v1/models")
    args = p.parse_args(argv)
    import uvicorn

    app = FixedRateUpstream(args.rate, args.ttft, args.models.split(","))
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        log_level="warning",
        access_log=False,
        backlog=4096,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
