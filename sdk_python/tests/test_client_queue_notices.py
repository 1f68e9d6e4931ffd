"""Queue notices: SSE comments ``: queued position=<int> eta_s=<float>`` before the first chunk.

The format is parsed as docs/protocol.md ("Queue notices") defines it. A paced stream hands
each notice to ``on_queued(position, eta_s)`` in the consumer's thread or task; the real
ones come through the official ``openai`` client (the drop-in clients, and ``pace``/``apace``
on openai's own streams) from a scripted local server: a small ASGI app on uvicorn on a
loopback port that sends notices, waits, then streams a reply. The gateway's own notices
are tested with the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest
import tokenpace_client as tp
import uvicorn
from client_support import arrivals, chunk, drain, paced
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route
from tokenpace_client.notices import QueueNotice, parse_queue_notice

WAIT_S = 10.0  # the longest the server holds the reply back for the client's go-ahead


@pytest.mark.parametrize(
    ("comment", "notice"),
    [
        (" queued position=3 eta_s=2.5", QueueNotice(3, 2.5)),
        (" queued position=1 eta_s=0", QueueNotice(1, 0.0)),
        ("queued position=12 eta_s=1e1", QueueNotice(12, 10.0)),
        (" queued position=2 tier=chat eta_s=4.", QueueNotice(2, 4.0)),  # unknown fields skipped
        (" ping", None),
        ("", None),
        (" queued", None),
        (" queued position=2", None),
        (" queued eta_s=1.0", None),
        (" queued position=0 eta_s=1.0", None),  # positions count from 1
        (" queued position=-1 eta_s=1.0", None),
        (" queued position=1.5 eta_s=1.0", None),
        (" queued position=1 eta_s=-1", None),
        (" queued position=1 eta_s=nan", None),
        (" queued position=1 eta_s=inf", None),
        (" queued position=1 eta_s=1e999", None),  # not finite
        (" queuedposition=1 eta_s=1", None),
        (" waiting position=1 eta_s=1", None),
    ],
)
def test_queue_notices_are_parsed_as_the_protocol_defines_them(comment, notice):
    assert parse_queue_notice(comment) == notice


def test_a_paced_stream_hands_each_notice_on_in_order_before_the_first_token():
    seen: list[tuple[float, int, float]] = []
    events = [
        ("queued", 0.5, QueueNotice(2, 1.5)),
        ("queued", 1.5, QueueNotice(1, 0.4)),
        *arrivals((2.0, chunk("a")), (2.0, chunk(" b")), end=2.0),
    ]
    stream, _, clock = paced(
        events, on_queued=lambda position, eta_s: seen.append((clock.now(), position, eta_s))
    )
    out = drain(stream, clock)
    assert seen == [(0.5, 2, 1.5), (1.5, 1, 0.4)]  # as each came, while nothing was shown
    assert stream.queued == QueueNotice(1, 0.4)
    assert [t for t, _ in out] == pytest.approx([2.0, 2.0 + 1 / 4.8])
    assert stream.timeline.arrivals == ((2.0, 1), (2.0, 1))  # a notice is no token
    assert stream.outcome == "completed"


# -- a scripted server and the official openai client ------------------------------


class Script:
    """What the server sends: queue notices, then (once told to go on) a short reply."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.sent_first_chunk_at: float | None = None

    def frames(self) -> Iterator[str]:
        yield ": queued position=2 eta_s=1.5\n\n"
        yield ": ping\n\n"
        yield ": queued position=1 eta_s=0.4\n\n"

    def chunks(self) -> Iterator[str]:
        for k, text in enumerate(["Hello", " there", "!"]):
            body = {
                "id": "chatcmpl-q",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "m",
                "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
            }
            if k == 0:
                self.sent_first_chunk_at = time.monotonic()
            yield f"data: {json.dumps(body)}\n\n"
        yield "data: [DONE]\n\n"

    async def body(self) -> AsyncIterator[str]:
        for frame in self.frames():
            yield frame
        started = time.monotonic()
        while not self.go.is_set() and time.monotonic() - started < WAIT_S:
            await asyncio.sleep(0.005)
        for frame in self.chunks():
            yield frame

    def app(self) -> Starlette:
        async def completions(request: Request) -> StreamingResponse:
            await request.body()
            return StreamingResponse(self.body(), media_type="text/event-stream")

        return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


@contextlib.contextmanager
def serve(script: Script) -> Iterator[str]:
    """uvicorn serving ``script`` on a free loopback port; yields the API's base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(script.app(), lifespan="off", log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.started, "the scripted server did not start"
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


MESSAGES: list[Any] = [{"role": "user", "content": "Hi"}]


class Recorder:
    """An ``on_queued`` that tells the server to go on once it has heard position 1."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.notices: list[tuple[int, float]] = []
        self.threads: set[str] = set()

    def __call__(self, position: int, eta_s: float) -> None:
        self.notices.append((position, eta_s))
        self.threads.add(threading.current_thread().name)
        if position == 1:
            self.script.go.set()


def _text(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks)


def test_the_drop_in_client_calls_on_queued_while_the_request_waits():
    script = Script()
    recorder = Recorder(script)
    with serve(script) as base_url:
        client = tp.OpenAI(base_url=base_url, api_key="k", max_retries=0, telemetry=False)
        started = time.monotonic()
        with client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, on_queued=recorder
        ) as stream:
            chunks = list(stream)
    # the server held the reply until on_queued heard position 1: the notices came while
    # the request waited, not with the first chunk
    assert script.sent_first_chunk_at is not None
    assert script.sent_first_chunk_at - started < WAIT_S / 2
    assert recorder.notices == [(2, 1.5), (1, 0.4)]  # ": ping" ignored
    assert recorder.threads == {threading.current_thread().name}  # the consumer's thread
    assert stream.queued == QueueNotice(1, 0.4)
    assert _text(chunks) == "Hello there!"
    assert stream.outcome == "completed"
    assert sum(n for _, n in stream.timeline.arrivals) == 3


def test_the_async_drop_in_client_calls_on_queued_while_the_request_waits():
    script = Script()
    recorder = Recorder(script)

    async def run(base_url: str) -> tuple[tp.AsyncPacedStream, list[Any], float]:
        client = tp.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0, telemetry=False)
        started = time.monotonic()
        stream = await client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, on_queued=recorder
        )
        async with stream:
            chunks = [c async for c in stream]
        return stream, chunks, started

    with serve(script) as base_url:
        stream, chunks, started = asyncio.run(run(base_url))
    assert script.sent_first_chunk_at is not None
    assert script.sent_first_chunk_at - started < WAIT_S / 2
    assert recorder.notices == [(2, 1.5), (1, 0.4)]
    assert stream.queued == QueueNotice(1, 0.4)
    assert _text(chunks) == "Hello there!"


def test_pace_surfaces_the_notices_of_a_plain_openai_stream():
    script = Script()
    recorder = Recorder(script)
    with serve(script) as base_url:
        client = openai.OpenAI(base_url=base_url, api_key="k", max_retries=0)
        raw = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        with tp.pace(raw, telemetry=False, on_queued=recorder) as stream:
            chunks = list(stream)
    assert recorder.notices == [(2, 1.5), (1, 0.4)]
    assert _text(chunks) == "Hello there!"


def test_a_stream_without_notices_has_none_and_on_queued_needs_a_stream():
    stream = tp.pace([chunk("a")], tds=1000.0, telemetry=False, on_queued=lambda *_: None)
    assert [c["choices"][0]["delta"]["content"] for c in stream] == ["a"]
    assert stream.queued is None
    client = tp.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", max_retries=0)
    with pytest.raises(TypeError, match=r"^on_queued: .*stream=True"):
        client.chat.completions.create(model="m", messages=MESSAGES, on_queued=print)
    with pytest.raises(TypeError, match=r"^on_queued: expected a callable"):
        client.chat.completions.create(model="m", messages=MESSAGES, stream=True, on_queued=3)
