"""The streaming load generator of the gateway benchmarks (bench/gateway_load.py, bench/soak.py).

``concurrency`` stream slots, each a keep-alive HTTP/1.1 connection (asyncio with
httptools' response parser; uvloop) that runs streaming chat completions back to back,
with a receive time for every read. Slot ``i`` starts ``ramp_s · i / concurrency``
after the run's start, and no stream starts after ``stop_s``. Each stream is timed
(TTFT: request written → first content chunk read; delivery delay: read time − the
upstream's emission stamp, which bench/fixed_rate_upstream.py writes into ``content``;
inter-chunk gaps) if it starts in the recorded window, and ends as one of:

- completed: ``[DONE]`` after exactly ``tokens`` content chunks;
- incomplete: no ``[DONE]`` (``no [DONE]``), or another number of chunks (``short``);
- error: a status other than 200 (``HTTP 503``), an in-stream error event
  (``error event``), the connection lost or unparseable (``ConnectionError``), or no end
  within ``stream_timeout_s`` (``TimeoutError``).

Every request is the same short chat, unless ``conversations`` is set: then each is a
later turn of one of that many conversations (:func:`conversation_turn`, a multi-KB
prompt that only its last message tells apart from the conversation's other turns),
drawn at random by each slot (seeded by its index), or, with ``fill``, request ``k`` of
the run is conversation ``k``'s (each conversation once: what fills a router's index).

:func:`run_load` runs a :class:`LoadSpec` in this process (the soak, beside its
samplers); ``python bench/loadgen.py SPEC`` in a process of its own (the cost benchmark,
pinned to the harness's CPUs), printing ``{"progress": n}`` lines and the result as
one ``{"result": ...}`` JSON line.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import resource
import sys
import time
from array import array
from dataclasses import asdict, dataclass, field
from typing import Any

import httptools
import numpy as np

_STAMP = re.compile(rb'"content": ?"(\d+)"')  # a content chunk, stamped by the upstream
HISTORY_CHARS = 2000  # characters of earlier turns in a conversation's turn


@dataclass
class LoadSpec:
    """One load generator run against one target."""

    host: str
    port: int
    key: str
    model: str
    tokens: int
    concurrency: int
    ramp_s: float  # stream starts staggered over this long
    record_s: float  # streams started in [ramp_s, ramp_s + record_s) are timed
    stop_s: float  # no stream starts after this (from the run's start)
    cut_s: float | None = None  # in-flight streams are dropped at this time
    window: tuple[float, float] | None = None  # chunks read in this window → chunks/s
    requests: int | None = None  # stop after this many started streams
    progress_every: int = 0  # print {"progress": n} after every n completed streams
    stream_timeout_s: float | None = None  # a stream not ended by then is an error
    keep_streams: bool = False  # the result lists every stream: start, TTFT, ending
    conversations: int = 0  # > 0: each request a later turn of one of this many conversations
    fill: bool = False  # with conversations: request k is conversation k's, each once


@dataclass
class LoadStats:
    ttft_us: array = field(default_factory=lambda: array("q"))
    delay_us: array = field(default_factory=lambda: array("q"))
    gap_us: array = field(default_factory=lambda: array("q"))
    win_start_us: int = 0
    win_end_us: int = 0
    win_chunks: int = 0
    chunks: int = 0
    completed: int = 0
    incomplete: int = 0
    errors: int = 0
    started: int = 0
    kinds: dict[str, int] = field(default_factory=dict)  # why streams did not complete
    streams: list[tuple[float, float | None, str | None]] = field(default_factory=list)

    def failed(self, kind: str, error: bool) -> None:
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        if error:
            self.errors += 1
        else:
            self.incomplete += 1


class _Stream:
    """One streaming request's bookkeeping, fed by the connection's body callback."""

    __slots__ = ("buf", "done", "error", "first", "last", "n", "record", "sent", "stats")

    def __init__(self, stats: LoadStats, record: bool) -> None:
        self.stats = stats
        self.sent = 0  # µs, set when the request is written
        self.record = record
        self.buf = b""
        self.n = 0
        self.first = 0  # µs of the first content chunk's read
        self.last = 0
        self.done = False
        self.error = False

    def feed(self, body: bytes, now: int) -> None:
        buf = self.buf + body
        end = buf.rfind(b"\n\n")
        if end < 0:
            self.buf = buf
            return
        events, self.buf = buf[:end], buf[end + 2 :]
        stamps = _STAMP.findall(events)
        if b"[DONE]" in events:
            self.done = True
        if b'{"error"' in events:
            self.error = True
        if not stamps:
            return
        n = len(stamps)
        st = self.stats
        st.chunks += n
        if st.win_start_us <= now < st.win_end_us:
            st.win_chunks += n
        if self.n == 0:
            self.first = now
        if self.record:
            if self.n == 0:
                st.ttft_us.append(now - self.sent)
            else:
                st.gap_us.append(now - self.last)
            st.gap_us.extend([0] * (n - 1))
            st.delay_us.extend([now - int(s) for s in stamps])
        self.n += n
        self.last = now


class _Connection(asyncio.Protocol):
    """A keep-alive HTTP/1.1 connection that runs one streaming request at a time."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self.transport: Any = None  # uvloop's TCPTransport
        self.stream: _Stream | None = None
        self.status = 0
        self.reusable = True
        self._now = 0
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._now = time.time_ns() // 1000
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"bad HTTP response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self._fail(ConnectionError("connection closed"))

    def _fail(self, exc: Exception) -> None:
        self.reusable = False
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)

    # httptools callbacks
    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.reusable = self._parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        if self.stream is not None:
            self.stream.feed(body, self._now)

    def on_message_complete(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def request(self, payload: bytes, stream: _Stream) -> None:
        assert self.transport is not None
        self.stream = stream
        self.status = 0
        self._waiter = asyncio.get_running_loop().create_future()
        stream.sent = time.time_ns() // 1000
        self.transport.write(payload)
        await self._waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def conversation_turn(
    n: int, rng: random.Random, history: int = HISTORY_CHARS
) -> list[dict[str, str]]:
    """A later turn of conversation ``n``: a system prompt of one of four apps,
    ``history`` characters of earlier turns (four of them), a new question."""
    turn = history // 4
    messages = [{"role": "system", "content": f"app {n % 4}: be brief. " * 40}]
    for t in range(4):
        messages.append({"role": "user", "content": f"{n}/{t} " + "q" * (turn // 3)})
        messages.append({"role": "assistant", "content": f"{n}/{t} " + "a" * (2 * turn // 3)})
    messages.append({"role": "user", "content": f"{n} next {rng.random()}"})
    return messages


def request_bytes(spec: LoadSpec, messages: list[dict[str, str]] | None = None) -> bytes:
    """The streaming chat completion a slot sends: ``messages``, or a short chat."""
    body = json.dumps(
        {
            "model": spec.model,
            "messages": messages or [{"role": "user", "content": "Say something."}],
            "max_tokens": spec.tokens,
            "stream": True,
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {spec.host}:{spec.port}\r\n"
        f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
        f"Authorization: Bearer {spec.key}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _ending(conn: _Connection, stream: _Stream, tokens: int) -> tuple[str, bool] | None:
    """Why ``stream`` did not complete, and whether that is an error; None: it did."""
    if conn.status != 200:
        return f"HTTP {conn.status}", True
    if stream.error:
        return "error event", True
    if not stream.done:
        return "no [DONE]", False
    if stream.n != tokens:
        return "short", False
    return None


async def _slot(i: int, spec: LoadSpec, stats: LoadStats, t0: float, t0_us: int) -> None:
    """One of the stream slots: streams back to back on a keep-alive connection."""
    loop = asyncio.get_running_loop()
    payload = request_bytes(spec)
    rng = random.Random(i)
    await asyncio.sleep(max(0.0, t0 + spec.ramp_s * i / spec.concurrency - loop.time()))
    conn: _Connection | None = None
    try:
        while True:
            now = loop.time() - t0
            if now >= spec.stop_s or (spec.requests is not None and stats.started >= spec.requests):
                return
            if conn is None or not conn.reusable:
                if conn is not None:
                    conn.close()
                _, conn = await loop.create_connection(_Connection, spec.host, spec.port)
            record = spec.ramp_s <= now < spec.ramp_s + spec.record_s
            if spec.conversations:
                n = stats.started if spec.fill else rng.randrange(spec.conversations)
                payload = request_bytes(spec, conversation_turn(n, rng))
            stream = _Stream(stats, record)
            stats.started += 1
            ending: tuple[str, bool] | None
            sent = conn.request(payload, stream)
            try:
                await (
                    sent
                    if spec.stream_timeout_s is None
                    else asyncio.wait_for(sent, spec.stream_timeout_s)
                )
            except (ConnectionError, TimeoutError) as exc:
                ending = (type(exc).__name__, True)
                conn.close()
                conn = None
            else:
                ending = _ending(conn, stream, spec.tokens)
            if ending is None:
                stats.completed += 1
                if spec.progress_every and stats.completed % spec.progress_every == 0:
                    print(json.dumps({"progress": stats.completed}), flush=True)
            else:
                stats.failed(*ending)
            if spec.keep_streams:
                ttft = (stream.first - stream.sent) / 1e6 if stream.n else None
                stats.streams.append(
                    ((stream.sent - t0_us) / 1e6, ttft, None if ending is None else ending[0])
                )
    finally:
        if conn is not None:
            conn.close()


def percentiles(values: array) -> dict[str, float] | None:
    """Mean, percentiles and maximum of µs ``values``, in ms."""
    if not len(values):
        return None
    a = np.frombuffer(values, dtype=np.int64) / 1000.0  # ms
    p50, p90, p99, p999 = np.percentile(a, [50, 90, 99, 99.9])
    return {
        "n": len(a),
        "mean": float(a.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "p99.9": float(p999),
        "max": float(a.max()),
    }


async def run_load(spec: LoadSpec) -> dict[str, Any]:
    """Run ``spec``'s slots to their end; the measurements (see the module docstring)."""
    loop = asyncio.get_running_loop()
    stats = LoadStats()
    t0 = loop.time() + 0.05
    t0_us = time.time_ns() // 1000 + 50_000
    if spec.window is not None:
        stats.win_start_us = t0_us + int(spec.window[0] * 1e6)
        stats.win_end_us = t0_us + int(spec.window[1] * 1e6)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    slots = [loop.create_task(_slot(i, spec, stats, t0, t0_us)) for i in range(spec.concurrency)]
    if spec.cut_s is not None:
        await asyncio.wait(slots, timeout=max(0.0, t0 + spec.cut_s - loop.time()))
        for task in slots:
            task.cancel()
    results = await asyncio.gather(*slots, return_exceptions=True)
    wall = loop.time() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    failures = [r for r in results if isinstance(r, BaseException)]
    failures = [r for r in failures if not isinstance(r, asyncio.CancelledError)]
    out: dict[str, Any] = {
        "wall_s": wall,
        "loadgen_cpu_s": (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime),
        "streams_started": stats.started,
        "streams_completed": stats.completed,
        "streams_incomplete": stats.incomplete,
        "streams_cut": stats.started - stats.completed - stats.incomplete - stats.errors,
        "errors": stats.errors + len(failures),
        "error_kinds": stats.kinds,
        "slot_failures": [repr(f) for f in failures[:3]],
        "chunks": stats.chunks,
        "ttft_ms": percentiles(stats.ttft_us),
        "delay_ms": percentiles(stats.delay_us),
        "gap_ms": percentiles(stats.gap_us),
    }
    if spec.window is not None:
        out["window_chunks"] = stats.win_chunks
        out["chunks_per_s"] = stats.win_chunks / (spec.window[1] - spec.window[0])
    if spec.keep_streams:
        out["streams"] = stats.streams
    return out


def spec_json(spec: LoadSpec) -> str:
    """``spec`` as the command-line argument of ``python bench/loadgen.py SPEC``."""
    return json.dumps(asdict(spec))


def main(argv: list[str]) -> int:
    """``python bench/loadgen.py SPEC``: run one load, print its result as one JSON line."""
    import uvloop

    spec = LoadSpec(**json.loads(argv[0]))
    if spec.window is not None:
        spec.window = (spec.window[0], spec.window[1])
    result = uvloop.run(run_load(spec))
    print(json.dumps({"result": result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
