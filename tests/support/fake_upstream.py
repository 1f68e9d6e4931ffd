"""A STAND-IN for vLLM's OpenAI-compatible server, which cannot run here.

:class:`FakeUpstream` is a small raw-ASGI app served by a real uvicorn on a loopback
port (:func:`upstream`): it streams OpenAI chunks at a fixed rate, records every body
and header it received, notices when the gateway drops the connection (as vLLM does, to
abort), and can be switched into failure modes (HTTP errors, garbage, truncation,
hanging).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from tests.support.asgi import read_body, serve_lifespan
from tests.support.servers import run_server

MODEL = "fake-model"


class FakeUpstream:
    """Stand-in for a vLLM OpenAI server (see the module docstring). Not a real engine."""

    def __init__(
        self,
        models: tuple[str, ...] = (MODEL,),
        *,
        n_tokens: int = 6,
        token_interval: float = 0.005,
        tokens_per_chunk: int = 1,
    ) -> None:
        self.models = models
        self.n_tokens = n_tokens
        self.tokens_per_chunk = tokens_per_chunk  # as vLLM's --stream-interval
        self.token_interval = token_interval
        self.mode = "ok"
        self.ignores_max_tokens = False  # a faulty engine: n_tokens whatever was asked
        self.first_delay = 0.0
        self.healthy = True
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.stream_headers: list[tuple[bytes, bytes]] = []  # more headers on every stream
        self.disconnects: list[float] = []  # time.monotonic() when a stream lost its client
        self.active = 0  # streams being generated now
        self.url = ""

    # -- ASGI ----------------------------------------------------------------------
    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        path, method = scope["path"], scope["method"]
        if method == "GET" and path in ("/health", "/v1/models"):
            if not self.healthy:
                await _json(send, 503, {"error": {"message": "unhealthy"}})
            elif path == "/health":
                await _json(send, 200, {})
            else:
                data = [{"id": m, "object": "model"} for m in self.models]
                await _json(send, 200, {"object": "list", "data": data})
            return
        if method != "POST" or path not in ("/v1/chat/completions", "/v1/completions"):
            await _json(send, 404, {"error": {"message": "not found"}})
            return
        body = json.loads(await read_body(receive))
        self.bodies.append(body)
        self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        chat = path.endswith("chat/completions")
        mode = self.mode
        if mode.startswith("http_"):
            status = int(mode.split("_")[1])
            err = {
                "message": f"fake upstream error {status}",
                "type": "BadRequestError",
                "param": None,
                "code": status,
            }
            await _json(send, status, {"error": err})
            return
        if not body.get("stream"):
            if mode == "hang_first":  # a long generation: answer nothing until dropped
                while (await receive())["type"] != "http.disconnect":
                    pass
                self.disconnects.append(time.monotonic())
                return
            if mode == "garbage":
                await _raw(send, 200, b"this is not json", b"application/json")
                return
            await _json(send, 200, self._full(body, chat))
            return
        await self._stream(body, chat, receive, send)

    async def _stream(self, body: dict, chat: bool, receive: Any, send: Any) -> None:
        done = False

        async def watch(scope: anyio.CancelScope) -> None:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    if not done:
                        self.disconnects.append(time.monotonic())
                        scope.cancel()
                    return

        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-cache"),
                    *self.stream_headers,
                ],
            }
        )
        self.active += 1
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch, tg.cancel_scope)
                try:
                    for event in self._events(body, chat):
                        if event is None:
                            await anyio.sleep_forever()
                        if isinstance(event, float):
                            await anyio.sleep(event)
                            continue
                        if event == b"CLOSE":
                            raise RuntimeError("fake upstream dies mid-stream")
                        if event == b"END":
                            break
                        await send({"type": "http.response.body", "body": event, "more_body": True})
                    done = True
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                finally:
                    done = True
                    tg.cancel_scope.cancel()
        finally:
            self.active -= 1

    def _events(self, body: dict, chat: bool) -> Iterator[bytes | float | None]:
        """The stream as a list of byte events, sleeps (float) and hangs (None)."""
        mode = self.mode
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        if self.ignores_max_tokens:
            limit = None
        n = min(int(limit), self.n_tokens) if limit else self.n_tokens
        choices = int(body.get("n") or 1)
        tools = body.get("tools")
        base = {"id": "cmpl-fake", "created": 1700000000, "model": body.get("model")}
        base["object"] = "chat.completion.chunk" if chat else "text_completion"

        continuous = usage and bool(
            (body.get("stream_options") or {}).get("continuous_usage_stats")
        )
        sent = 0  # completion tokens so far, all choices

        def ev(obj: dict) -> bytes:
            if continuous:
                u = {"prompt_tokens": 5, "completion_tokens": sent, "total_tokens": 5 + sent}
                obj = {**obj, "usage": u}
            elif usage:
                obj = {**obj, "usage": None}
            return b"data: " + json.dumps({**base, **obj}).encode() + b"\n\n"

        if self.first_delay:
            yield self.first_delay
        if mode == "hang_first":
            yield None
        if mode == "garbage_first":
            yield b"data: this is not json\n\n"
            yield b"END"
            return
        if chat:
            for c in range(choices):
                delta = {"role": "assistant", "content": ""}
                yield ev(
                    {
                        "choices": [
                            {"index": c, "delta": delta, "logprobs": None, "finish_reason": None}
                        ]
                    }
                )
        step = self.tokens_per_chunk
        for i in range(0, n, step):
            text = "".join(f"t{j} " for j in range(i, min(i + step, n)))
            if i == 3:
                if mode == "close_mid":
                    yield b"CLOSE"
                if mode == "garbage_mid":
                    yield b"data: {not json\n\n"
                    yield b"END"
                    return
                if mode == "error_mid":
                    err = {"message": "engine crashed", "type": "InternalServerError"}
                    yield (
                        b"data: "
                        + json.dumps({"error": {**err, "param": None, "code": 500}}).encode()
                        + b"\n\n"
                    )
                    yield b"END"
                    return
                if mode == "hang_mid":
                    yield None
            yield self.token_interval
            for c in range(choices):
                if chat and tools:
                    fn = tools[0]["function"]["name"]
                    call = {"index": 0, "function": {"arguments": "{" if i == 0 else " "}}
                    if i == 0:
                        call.update(id="call_1", type="function")
                        call["function"]["name"] = fn
                    delta = {"tool_calls": [call]}
                    if i == n - 1:
                        call["function"]["arguments"] = "}"
                    yield ev({"choices": [{"index": c, "delta": delta, "finish_reason": None}]})
                elif chat:
                    sent += min(step, n - i)
                    yield ev(
                        {
                            "choices": [
                                {"index": c, "delta": {"content": text}, "finish_reason": None}
                            ]
                        }
                    )
                else:
                    sent += min(step, n - i)
                    yield ev(
                        {
                            "choices": [
                                {
                                    "index": c,
                                    "text": text,
                                    "logprobs": None,
                                    "finish_reason": None,
                                }
                            ]
                        }
                    )
        reason = "tool_calls" if tools else ("length" if limit and limit <= n else "stop")
        for c in range(choices):
            if chat:
                yield ev({"choices": [{"index": c, "delta": {}, "finish_reason": reason}]})
            else:
                yield ev({"choices": [{"index": c, "text": "", "finish_reason": reason}]})
        if usage:
            u = {
                "prompt_tokens": 5,
                "completion_tokens": n * choices,
                "total_tokens": 5 + n * choices,
            }
            yield b"data: " + json.dumps({**base, "choices": [], "usage": u}).encode() + b"\n\n"
        if mode == "no_done":
            return
        yield b"data: [DONE]\n\n"

    def _full(self, body: dict, chat: bool) -> dict:
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        n = min(int(limit), self.n_tokens) if limit else self.n_tokens
        text = "".join(f"t{i} " for i in range(n))
        usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}
        base = {
            "id": "cmpl-fake",
            "created": 1700000000,
            "model": body.get("model"),
            "usage": usage,
        }
        if chat:
            msg = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": msg, "logprobs": None, "finish_reason": "stop"}
            return {**base, "object": "chat.completion", "choices": [choice]}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}
        return {**base, "object": "text_completion", "choices": [choice]}


async def _json(send: Any, status: int, obj: Any) -> None:
    await _raw(send, status, json.dumps(obj).encode(), b"application/json")


async def _raw(send: Any, status: int, payload: bytes, ctype: bytes) -> None:
    headers = [(b"content-type", ctype), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


@asynccontextmanager
async def upstream(**kwargs: Any) -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream(**kwargs)
    async with run_server(fake) as url:
        fake.url = url
        yield fake
