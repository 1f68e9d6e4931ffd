"""The SSE relay: backend chunks out to the client as they come, nothing added to them.

One :class:`StreamRelay` per streaming request. A pump task reads the backend's
:class:`~gateway.backends.ChunkStream` into a small queue, a batch of chunks per read;
the response generator waits on that queue with deadlines, which is what lets it

- send ``: ping`` comments while it waits (``timeouts.ping_interval_s``), before the
  first token above all, so proxies and clients keep the connection;
- enforce the first-chunk (``timeouts.first_byte_s``) and between-chunk
  (``timeouts.idle_s``) deadlines without cancelling a read half-way;
- fail over to another backend when the stream fails before its first chunk (only
  pings went out, so the client cannot tell), and otherwise end the stream with an
  OpenAI-style error event and ``data: [DONE]``: the client never hangs.

When the client goes away sse-starlette cancels the generator; the relay then cancels
the pump and closes the backend stream (for HTTP backends: the upstream connection, so
vLLM aborts the generation) within :data:`~gateway.dispatch.CLOSE_TIMEOUT_S`. Nothing
outlives the request: the pump is awaited, the lease on the backend released, once.

Every chunk carrying tokens is timed when it is handed to the client: TTFT, inter-token
times and, at the end of a completed stream, the gateway-side QoE
(:func:`qos.metrics.andes_qoe` and :func:`qos.metrics.monotone_qoe`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from array import array
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import numpy as np
import orjson

from gateway.backends import BackendError, Chunk, ChunkStream, RequestContext
from gateway.dispatch import CLOSE_TIMEOUT_S, Attempt, open_attempt
from gateway.errors import TIMEOUT, sse_error_event
from gateway.metrics import UNKNOWN
from gateway.state import GatewayState
from qos.metrics import andes_qoe, monotone_qoe

log = logging.getLogger("tokenpace.gateway")

PING = b": ping\n\n"
DONE = b"data: [DONE]\n\n"
_QUEUE_SIZE = 32
_END = object()


def encode_chunk(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def chunk_tokens(chunk: dict[str, Any]) -> int:
    """Tokens a chunk delivers: one per choice with new text, reasoning or tool call.

    vLLM and OpenAI send one token per choice per chunk when streaming; a chunk with only
    a role, a finish reason or usage delivers none.
    """
    n = 0
    for choice in chunk.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            if (
                delta.get("content")
                or delta.get("reasoning_content")
                or delta.get("reasoning")
                or delta.get("tool_calls")
                or delta.get("refusal")
            ):
                n += 1
        elif choice.get("text"):
            n += 1
    return n


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _Channel:
    """The pump's bounded queue to the relay: one producer, one consumer, a timed get.

    What ``asyncio.Queue`` under ``anyio.move_on_after`` did, for a fraction of the CPU
    per chunk (no cancel scope, no task lookup): a chunk already waiting is taken at
    once, and a wait costs one future and one timer.
    """

    __slots__ = ("_getter", "_items", "_loop", "_maxsize", "_putter")

    def __init__(self, maxsize: int) -> None:
        self._items: deque[Any] = deque()
        self._maxsize = maxsize
        self._loop = asyncio.get_running_loop()
        self._getter: asyncio.Future[None] | None = None
        self._putter: asyncio.Future[None] | None = None

    async def put(self, item: Any) -> None:
        """Append ``item``, first waiting while ``maxsize`` items are queued."""
        while len(self._items) >= self._maxsize:
            self._putter = self._loop.create_future()
            await self._putter
        self._items.append(item)
        if self._getter is not None:
            _wake(self._getter)

    async def get(self, timeout: float) -> Any:
        """The next item, or ``None`` when none came within ``timeout`` seconds."""
        if not self._items:
            self._getter = fut = self._loop.create_future()
            timer = self._loop.call_later(timeout, _wake, fut)
            try:
                await fut
            finally:
                timer.cancel()
                self._getter = None
            if not self._items:
                return None
        return self._take()

    def take_batch(self) -> list[Chunk] | None:
        """The next item if it is a batch already queued (no waiting), else ``None``."""
        if self._items and isinstance(self._items[0], list):
            return self._take()
        return None

    def _take(self) -> Any:
        item = self._items.popleft()
        if self._putter is not None:
            _wake(self._putter)
        return item


async def _pump(stream: ChunkStream, queue: _Channel) -> None:
    """Backend stream -> queue: batches of chunks, then ``_END`` or a :class:`BackendError`."""
    try:
        while batch := await stream.next_batch():
            await queue.put(batch)
        await queue.put(_END)
    except BackendError as exc:
        await queue.put(exc)
    except Exception as exc:
        log.warning("backend stream raised %r", exc, exc_info=exc)
        await queue.put(BackendError(f"The backend failed mid-stream ({type(exc).__name__})."))


class StreamRelay:
    """Relays one streaming request; :meth:`events` is the response body."""

    def __init__(
        self,
        gw: GatewayState,
        raw: dict[str, Any],
        ctx: RequestContext,
        attempt: Attempt,
        tried: set[str],
        info: dict[str, Any],
        on_tokens: Callable[[int], None] | None = None,
    ) -> None:
        self.gw = gw
        self.on_tokens = on_tokens  # per token-carrying chunk (fair-share charging); no I/O
        self.raw = raw
        self.ctx = ctx
        self.attempt: Attempt | None = attempt
        self.tried = tried
        self.info = info  # labels for the access log / request counter
        info["backend"] = attempt.state.name
        info["outcome"] = "aborted"  # until it completes or errs
        self._pump: asyncio.Task[None] | None = None
        self._queue: _Channel | None = None
        self.sent_any = False  # a chunk reached the client: no more failover
        self.times = array("d")  # emission times of token-carrying chunks, s since receipt
        self.counts = array("q")  # tokens in each
        self.n_tokens = 0
        self.usage: dict[str, Any] | None = None
        self._last_emit = 0.0
        self._last_token_at = 0.0
        self._finished = False
        m, tier = gw.metrics, ctx.tier.name
        self._ttft = m.ttft.labels(ctx.tenant, tier, attempt.state.name)
        self._itl = m.itl.labels(tier, attempt.state.name)

    # -- the response body ---------------------------------------------------------
    async def events(self) -> AsyncIterator[bytes]:
        t = self.gw.config.timeouts
        ping = t.ping_interval_s
        try:
            while True:
                assert self.attempt is not None
                self._start_pump()
                opened = time.monotonic()
                failure: BackendError | None = None
                while True:
                    if self.sent_any:
                        deadline, what = self._last_emit + t.idle_s, "between two chunks"
                    else:
                        deadline, what = opened + t.first_byte_s, "before the first chunk"
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        failure = BackendError(
                            f"The backend sent nothing for too long ({what}).",
                            status=504,
                            code="upstream_timeout",
                            type=TIMEOUT,
                        )
                        break
                    queue = self._queue
                    assert queue is not None
                    item = await queue.get(min(remaining, ping) if ping > 0 else remaining)
                    if item is None:  # a deadline passed: a ping, or the timeout above
                        if time.monotonic() < deadline:
                            yield PING
                        continue
                    if item is _END:
                        break
                    if isinstance(item, BackendError):
                        failure = item
                        break
                    # Chunks already queued go out in the same write: under load, one
                    # send (and one syscall) for several chunks; never a wait to batch.
                    while (more := queue.take_batch()) is not None:
                        item.extend(more)
                    yield self._emit(item)
                if failure is None:
                    self.info["outcome"] = "completed"
                    yield DONE
                    return
                failed = self.attempt.state
                await self._close_attempt()
                self.gw.router.report_failure(failed, failure)
                if not self.sent_any and failure.retryable:
                    # Only pings went out: try the next backend, unseen by the client.
                    self.gw.metrics.failovers.labels(failed.name).inc()
                    log.info(
                        "backend %s failed before the first chunk: %s", failed.name, failure.message
                    )
                    try:
                        self.attempt = await open_attempt(
                            self.gw, self.raw, self.ctx, self.tried, self.info, failure
                        )
                    except BackendError as exc:
                        failure = exc
                    else:
                        self._relabel()
                        continue
                self.info["outcome"] = "error"
                self.info["error"] = failure.message
                yield sse_error_event(failure.body)
                yield DONE
                return
        finally:
            await self.finish()

    def _relabel(self) -> None:
        assert self.attempt is not None
        name = self.attempt.state.name
        self.info["backend"] = name
        self._ttft = self.gw.metrics.ttft.labels(self.ctx.tenant, self.ctx.tier.name, name)
        self._itl = self.gw.metrics.itl.labels(self.ctx.tier.name, name)

    def _start_pump(self) -> None:
        assert self.attempt is not None
        self._queue = _Channel(_QUEUE_SIZE)
        self._pump = asyncio.get_running_loop().create_task(
            _pump(self.attempt.stream, self._queue), name=f"tokenpace-pump-{self.ctx.request_id}"
        )

    def _emit(self, batch: list[Chunk]) -> bytes:
        """Account for queued chunks (tokens, times, usage); return their event bytes."""
        now = time.monotonic()
        itl = self._itl
        n_batch = 0
        out: list[bytes] = []
        for chunk, event in batch:
            n = chunk_tokens(chunk)
            usage = chunk.get("usage")
            if isinstance(usage, dict):
                self.usage = usage
                total = usage.get("completion_tokens")
                sent = self.n_tokens + n_batch
                if n and isinstance(total, int) and total > sent + n:
                    # Several tokens in one chunk (vLLM's --stream-interval > 1) and a
                    # running count to tell how many (continuous usage stats): count all.
                    n = total - sent
            if n:
                if self.n_tokens + n_batch == 0:
                    self._ttft.observe(now - self.ctx.received_at)
                else:  # chunks sent together: the gap since the previous write, then 0s
                    itl.observe(now - self._last_token_at)
                self._last_token_at = now
                n_batch += n
            out.append(event if event is not None else encode_chunk(chunk))
        if n_batch:
            # Tokens sent in one write reach the client together: one point of the timeline.
            self.times.append(now - self.ctx.received_at)
            self.counts.append(n_batch)
            self.n_tokens += n_batch
            if self.attempt is not None:
                self.attempt.lease.tokens(n_batch)
            if self.on_tokens is not None:
                self.on_tokens(n_batch)
        self.sent_any = True
        self._last_emit = now
        return out[0] if len(out) == 1 else b"".join(out)

    # -- teardown ------------------------------------------------------------------
    async def _close_attempt(self) -> None:
        pump, self._pump = self._pump, None
        attempt, self.attempt = self.attempt, None
        with anyio.CancelScope(shield=True):
            if pump is not None and not pump.done():
                pump.cancel()
                with anyio.move_on_after(CLOSE_TIMEOUT_S):
                    await asyncio.wait([pump])
            if attempt is not None:
                await attempt.close()

    async def finish(self) -> None:
        """Close everything and record the stream's metrics (idempotent).

        Runs when the body generator ends (normally, by error or cancelled) and again as
        the response's background task, for a response that never started its body.
        """
        if self._finished:
            return
        self._finished = True
        await self._close_attempt()
        self._record()

    def _record(self) -> None:
        ctx, m = self.ctx, self.gw.metrics
        backend = self.info.get("backend", UNKNOWN)
        tokens = self.n_tokens
        if self.usage is not None and isinstance(self.usage.get("completion_tokens"), int):
            tokens = self.usage["completion_tokens"]
        self.info["tokens"] = tokens
        if tokens:
            m.tokens.labels(ctx.tenant, ctx.tier.name, backend).inc(tokens)
        if self.n_tokens:
            self.info["ttft_s"] = round(self.times[0], 6)
        if self.info.get("outcome") != "completed" or not self.n_tokens:
            return
        timeline = np.column_stack(
            (
                np.frombuffer(self.times, dtype=np.float64),
                np.frombuffer(self.counts, dtype=np.int64),
            )
        )
        try:
            andes = andes_qoe(timeline, ctx.tier.ttft, ctx.tier.tds)
            mono = monotone_qoe(timeline, ctx.tier.ttft, ctx.tier.tds)
        except ValueError as exc:  # cannot happen with monotonic times; never fail a stream
            log.warning("QoE not computed: %s", exc)
            return
        m.qoe.labels(ctx.tenant, ctx.tier.name, "andes").observe(andes)
        m.qoe.labels(ctx.tenant, ctx.tier.name, "monotone").observe(mono)
        self.info["qoe_andes"] = round(andes, 4)
        self.info["qoe_monotone"] = round(mono, 4)
