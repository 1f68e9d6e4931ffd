"""What one request costs the gateway, counted rather than timed (this module holds no
tests of its own).

:class:`CallCounter` is a ``sys.setprofile`` hook that counts the Python and builtin
calls made on the gateway's behalf: every call with a function of ``gateway/`` or
``qos/`` on its stack, the libraries' work under them included (a metric observed costs
the ``prometheus_client`` calls it makes, an upstream read aiohttp's), and every
coroutine resumed there (each chunk that wakes a chain of coroutines resumes each frame
of it). What runs with no gateway frame above it is not counted: the server's and the
HTTP client's protocol callbacks, which the stack floor (bench/stack_floor.py) runs too,
and the test's own client and upstream. Nor is the work of the tasks already running
when counting began (health checks, the telemetry's flush loop, the load history):
periodic, not per request.

:class:`LockstepUpstream` is an OpenAI-compatible streaming upstream that sends each
chunk only once the test's client has read the previous one through the gateway, so
every chunk is a read, a batch and a write of its own: the most work per chunk the relay
ever does (under load it relays several chunks per batch), and the same count on every
machine, however loaded. :func:`measure` streams requests of two lengths through a
gateway in front of it and returns the calls per chunk (the difference between the two,
per chunk) and per request (the rest); :func:`retained_per_chunk` the bytes the gateway's
code holds per chunk relayed, in the middle of a stream (``tracemalloc``).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tracemalloc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from tests.support.asgi import read_body, serve_lifespan

ROOT = Path(__file__).resolve().parents[2]
OWN = (str(ROOT / "gateway") + "/", str(ROOT / "qos") + "/")

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class CallCounter:
    """Counts the calls made on the gateway's behalf while installed (module doc)."""

    def __init__(self) -> None:
        self.calls = 0
        self._own: dict[str, bool] = {}
        self._skip: set[asyncio.Task[Any]] = set()

    def _is_own(self, filename: str) -> bool:
        own = self._own.get(filename)
        if own is None:
            own = self._own[filename] = filename.startswith(OWN)
        return own

    def _under_own(self, frame: FrameType | None) -> bool:
        while frame is not None:
            if self._is_own(frame.f_code.co_filename):
                return True
            frame = frame.f_back
        return False

    def _hook(self, frame: FrameType, event: str, arg: Any) -> None:
        # "call": ``frame`` is the function called (or the coroutine resumed);
        # "c_call": the one calling a builtin
        if event not in ("call", "c_call"):
            return
        if self._under_own(frame) and asyncio.current_task() not in self._skip:
            self.calls += 1

    def __enter__(self) -> CallCounter:
        current = asyncio.current_task()
        self._skip = {t for t in asyncio.all_tasks() if t is not current}
        sys.setprofile(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class LockstepUpstream:
    """A stand-in OpenAI upstream (raw ASGI) whose next chunk waits for :meth:`advance`."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._go = asyncio.Event()

    def advance(self) -> None:
        """The client read a chunk: the upstream may send the next."""
        self._go.set()

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        if scope["method"] == "GET":
            models = {"object": "list", "data": [{"id": self.model, "object": "model"}]}
            body = json.dumps(models).encode()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": body})
            return
        request = json.loads(await read_body(receive))
        n = int(request.get("max_tokens") or request.get("max_completion_tokens"))
        head = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": self.model}
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        self._go.set()
        for i in range(n):
            await self._go.wait()
            self._go.clear()
            delta = {"role": "assistant", "content": f"t{i} "} if i == 0 else {"content": f"t{i} "}
            chunk = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            await send({"type": "http.response.body", "body": _event(chunk), "more_body": True})
        await self._go.wait()
        self._go.clear()
        end = {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
        usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3}
        last = _event(end) + _event({**head, "choices": [], "usage": usage}) + b"data: [DONE]\n\n"
        await send({"type": "http.response.body", "body": last, "more_body": False})


async def stream(
    client: httpx.AsyncClient,
    upstream: LockstepUpstream,
    body: dict[str, Any],
    on_chunk: Callable[[int], None] | None = None,
) -> int:
    """One streamed request in lockstep; ``on_chunk(k)`` after the k-th event is read
    (before the upstream may send the next); the events read."""
    events = 0
    buf = b""
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for part in resp.aiter_raw():
            buf += part
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: "):
                    continue
                events += 1
                if on_chunk is not None:
                    on_chunk(events)
                upstream.advance()
    return events


@dataclass(frozen=True)
class Cost:
    """The gateway's calls per relayed chunk and per request (besides its chunks)."""

    per_chunk: float
    per_request: float


async def measure(
    client: httpx.AsyncClient,
    upstream: LockstepUpstream,
    body: dict[str, Any],
    done: Callable[[], bool],
    flush: Callable[[], Awaitable[None]],
    short: int = 8,
    long: int = 40,
) -> Cost:
    """Calls per chunk and per request, from a stream of ``short`` and one of ``long``
    content chunks; ``done()``: the gateway has finished the last request (its lease
    returned); ``flush()`` writes its QoE record to the store (the telemetry's flush
    loop does it for many records at a time), counted with the request."""
    counts = {}
    for n in (short, short, long):  # the first, uncounted: caches and labels warm up
        with CallCounter() as counter:
            await stream(client, upstream, {**body, "max_tokens": n})
            while not done():
                await asyncio.sleep(0.001)
            await flush()
        counts[n] = counter.calls
    per_chunk = (counts[long] - counts[short]) / (long - short)
    return Cost(per_chunk, counts[short] - short * per_chunk)


async def retained_per_chunk(
    client: httpx.AsyncClient,
    upstream: LockstepUpstream,
    body: dict[str, Any],
    first: int = 16,
    last: int = 144,
) -> float:
    """Bytes allocated by the gateway's own code and still held, per chunk relayed
    between chunk ``first`` and chunk ``last`` of one stream (``tracemalloc``)."""
    own = [tracemalloc.Filter(True, prefix + "*") for prefix in OWN]
    sizes: dict[int, int] = {}

    def sample(k: int) -> None:
        if k in (first, last):
            stats = tracemalloc.take_snapshot().filter_traces(own).statistics("filename")
            sizes[k] = sum(s.size for s in stats)

    tracemalloc.start()
    try:
        await stream(client, upstream, {**body, "max_tokens": last + 8}, sample)
    finally:
        tracemalloc.stop()
    return (sizes[last] - sizes[first]) / (last - first)
