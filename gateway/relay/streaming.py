"""The SSE relay: backend chunks out to the client as they come, nothing added to them.

One :class:`StreamRelay` per streaming request; :meth:`StreamRelay.send_body` sends the
response body. It reads the backend's :class:`~gateway.backends.ChunkStream` a batch at
a time with a deadline (pings while it waits, the first-chunk and between-chunk
timeouts), fails over before the first chunk, and otherwise ends a failed stream with an
OpenAI error event and ``data: [DONE]`` (a stream still open when the gateway's drain
runs out too: ``server_shutting_down``, :mod:`gateway.relay.drain`; a backend that
sends more output tokens than the request allows, max_tokens × n: ``upstream_too_long``,
before the batch that passes it). Every chunk
carrying tokens is timed as it is handed to the client; :meth:`StreamRelay.finish`
returns the stream's
:class:`~gateway.context.StreamOutcome`: TTFT and, for a completed stream, its
:class:`~gateway.context.Emissions`, from which the telemetry measures its QoE with
other streams' in a batch (:mod:`gateway.telemetry.replies`), off the request's path.
docs/architecture/gateway.md, "The streaming relay". A traced request's body is the span
``tokenpace.stream``, which ends with the outcome, the QoE
(:func:`qos.metrics.reply_qoe`, measured then: tracing pays for it) and the longest
freeze on the request's span too.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from array import array
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette.types import Send

from gateway.backends import BackendError, Batch
from gateway.config.schema import TimeoutsConfig
from gateway.context import Emissions, Outcome, StreamOutcome
from gateway.errors import SERVER_ERROR, TIMEOUT, GatewayError, sse_error_event
from gateway.relay.dispatch import Attempt, Failover
from gateway.relay.drain import Drain, shutting_down
from gateway.relay.read_deadline import ReadDeadline
from gateway.relay.reader import ReaderChannel
from gateway.telemetry.metrics import GatewayMetrics, observe_many
from gateway.telemetry.tracing import end_span, outcome_attributes
from qos.metrics import ReplyQoE, freezes, reply_qoe
from qos.signals import Presence, ReaderSignal

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger("tokenpace.gateway")

BODY = "http.response.body"  # the ASGI message type
PING = b": ping\n\n"
DONE = b"data: [DONE]\n\n"
# Tokens sent are charged (router lease, fair share) and their gaps observed in one
# settlement: with the first write carrying tokens this long after the last settlement,
# and when the stream ends.
SETTLE_S = 1.0


def _too_long(limit: int) -> GatewayError:
    """The error event of a stream cut at the request's output limit."""
    return GatewayError(
        502,
        f"The backend sent more than the {limit} output tokens this request allows "
        "(max_tokens, or the gateway's limit, times n); the stream was ended there.",
        type=SERVER_ERROR,
        code="upstream_too_long",
    )


class StreamRelay:
    """Relays one streaming request; :meth:`send_body` sends the response body."""

    def __init__(
        self,
        failover: Failover,
        metrics: GatewayMetrics,
        timeouts: TimeoutsConfig,
        attempt: Attempt,
        drain: Drain,
        readers: ReaderChannel,
        on_finish: Callable[[StreamOutcome], Awaitable[None]] | None = None,
    ) -> None:
        self.failover = failover  # the request's attempts; its hold is charged the tokens
        self.metrics = metrics
        self.timeouts = timeouts
        self.drain = drain
        self._shut_down = False  # the drain ran out: end the stream at the next turn
        self.readers = readers  # reader signals for this stream, from any replica
        self._left = False  # the reader left: end the stream at the next turn
        self.on_finish = on_finish  # once, with the outcome, after the stream's teardown
        self.ctx = ctx = failover.ctx
        self.attempt: Attempt | None = attempt
        self.backend = attempt.state.name
        self.outcome: Outcome = "aborted"  # until it completes or errs
        self.error: str | None = None
        self.sent_any = False  # a chunk reached the client: no more failover
        self.times = array("d")  # emission times of token-carrying chunks, s since receipt
        self.counts = array("q")  # tokens in each
        self.n_tokens = 0
        self.max_tokens = ctx.max_output_tokens or sys.maxsize
        self.usage: dict[str, Any] | None = None
        self._quiet_until = 0.0  # the backend must send something by then (a timeout)
        self._settled = 0  # batches of ``times`` charged and observed (:meth:`_settle`)
        self._settle_at = 0.0  # when the next token-carrying batch settles
        self._together = 0  # token chunks sent in a write after its first, not yet observed
        self._result: StreamOutcome | None = None
        self._deadline = ReadDeadline()
        self._span: Span | None = None  # tokenpace.stream, when traced
        tier = ctx.tier.name
        self._ttft = metrics.ttft.labels(ctx.tenant, tier, self.backend)
        self._itl = metrics.itl.labels(tier, self.backend)

    # -- the response body ---------------------------------------------------------
    def send_body(self, send: Send) -> Coroutine[Any, Any, None]:
        """Send the body's messages with the ASGI ``send``, each with ``more_body``
        (the response sends the last), then :meth:`finish`; in a span when traced.

        Returns the coroutine to await rather than awaiting it in a frame of its own:
        every chunk resumes each frame of the chain that awaits the backend."""
        if self.failover.trace is None:
            return self._send_body(send)
        return self._traced_body(send)

    async def _traced_body(self, send: Send) -> None:
        trace = self.failover.trace
        assert trace is not None
        self._span = span = trace.start("tokenpace.stream", {})
        with trace.current(span):  # a failover's attempts nest under it
            await self._send_body(send)

    async def _send_body(self, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.drain.add(self)
        self.readers.add(self.ctx.request_id, self, self.ctx.tier.tds)
        try:
            await self._relay(send, task)
        except asyncio.CancelledError:
            if self.drain.expired and self.outcome == "aborted":  # cut by the server, late
                self.outcome, self.error = "error", shutting_down().message
            raise
        finally:
            self.readers.discard(self.ctx.request_id)
            self.drain.discard(self)
            await self.finish()

    def shut_down(self) -> None:
        """The drain ran out: the stream ends with ``server_shutting_down`` and [DONE]."""
        self._shut_down = True
        self._deadline.expire()

    def reader_signal(self, signal: ReaderSignal) -> None:
        """The reader's client said ``signal``: to the engine, when it runs in this
        process; ``left`` ends the stream at once (upstream closed: the engine aborts the
        reply) with ``data: [DONE]`` and no error, outcome ``aborted``, the tokens sent
        charged as for any stream."""
        if self.attempt is not None:
            self.attempt.state.backend.reader_signal(self.ctx.request_id, signal)
        if signal.presence is Presence.LEFT:
            self._left = True
            self._deadline.expire()

    async def _relay(self, send: Send, task: asyncio.Task[Any]) -> None:
        t = self.timeouts
        ping = t.ping_interval_s
        while True:
            assert self.attempt is not None
            stream = self.attempt.stream
            self._quiet_until = time.monotonic() + t.first_byte_s
            failure: BackendError | None = None
            ended = False  # the backend's stream ended
            too_long = False  # the backend sent more than the request allows
            while not (self._shut_down or self._left):
                deadline = self._quiet_until
                now = time.monotonic()
                if now >= deadline:
                    what = "between two chunks" if self.sent_any else "before the first chunk"
                    failure = BackendError(
                        f"The backend sent nothing for too long ({what}).",
                        status=504,
                        code="upstream_timeout",
                        type=TIMEOUT,
                    )
                    break
                until = min(deadline, now + ping) if ping > 0 else deadline
                # The next batch (no chunks at the end), None when none came by ``until``
                # (the read is cancelled; reads are cancel-safe), or its failure.
                self._deadline.begin(task, until)
                try:
                    got = await stream.next_batch()
                except asyncio.CancelledError:
                    if not self._deadline.passed():
                        raise
                    got = None
                except BackendError as exc:
                    failure = exc
                    break
                except Exception as exc:
                    log.warning("backend stream raised %r", exc, exc_info=exc)
                    failure = BackendError(f"The backend failed mid-stream ({type(exc).__name__}).")
                    break
                finally:
                    self._deadline.end()
                if got is None:  # a deadline passed: a ping, or the timeout above
                    if time.monotonic() < deadline:
                        await send({"type": BODY, "body": PING, "more_body": True})
                    continue
                if not got.payloads:
                    ended = True
                    break
                if self.n_tokens + got.tokens > self.max_tokens:
                    too_long = True
                    break
                # Everything that arrived goes out in one write: under load, one send
                # (and one syscall) for several chunks; never a wait to batch.
                await send({"type": BODY, "body": self._emit(got), "more_body": True})
            if ended:
                self.outcome = "completed"
                await send({"type": BODY, "body": DONE, "more_body": True})
                return
            if self._left and failure is None:  # the reader left: a clean end, "aborted"
                await self._close_attempt()
                await send({"type": BODY, "body": DONE, "more_body": True})
                return
            if failure is None:  # cut or shut down: the gateway's end, not the backend's
                await self._close_attempt()
                await self._end(send, _too_long(self.max_tokens) if too_long else shutting_down())
                return
            failed = self.attempt
            await self._close_attempt(failure)
            final: GatewayError = failure
            if self.sent_any:
                self.failover.report(failed.state, failure)
            else:
                # Only pings went out: the next backend, unseen by the client.
                try:
                    self.attempt = await self.failover.open_stream(failed, failure)
                except GatewayError as exc:
                    final = exc
                    self.backend = self.failover.backend or self.backend
                else:
                    self._relabel()
                    continue
            await self._end(send, final)
            return

    async def _end(self, send: Send, error: GatewayError) -> None:
        """End the stream with ``error``'s event and [DONE]."""
        self.outcome = "error"
        self.error = error.message
        end = sse_error_event(error.body) + DONE
        await send({"type": BODY, "body": end, "more_body": True})

    def _relabel(self) -> None:
        assert self.attempt is not None
        name = self.backend = self.attempt.state.name
        self._ttft = self.metrics.ttft.labels(self.ctx.tenant, self.ctx.tier.name, name)
        self._itl = self.metrics.itl.labels(self.ctx.tier.name, name)

    def _emit(self, batch: Batch) -> bytes:
        """Account for a batch (tokens, times, usage); return its event bytes."""
        now = time.monotonic()
        if batch.usage is not None:
            self.usage = batch.usage
        n = batch.tokens
        if n:
            at = now - self.ctx.received_at
            if not self.n_tokens:
                self._ttft.observe(at)
            # Tokens sent in one write reach the client together: one point of the timeline.
            self.times.append(at)
            self.counts.append(n)
            self.n_tokens += n
            self._together += batch.token_chunks - 1  # chunks sent together: 0 s apart
            if now >= self._settle_at:
                self._settle(now)
        self.sent_any = True
        self._quiet_until = now + self.timeouts.idle_s
        return batch.data

    def _settle(self, now: float) -> None:
        """Charge the tokens sent since the last settlement to the request's hold (the
        router's lease, the tenant's share; no I/O) and observe their inter-token gaps, in
        bulk."""
        self._settle_at = now + SETTLE_S
        done, end = self._settled, len(self.times)
        if done == end:
            return
        self._settled = end
        self.failover.hold.tokens(sum(self.counts[done:end]))
        times = self.times
        gaps = [times[i] - times[i - 1] for i in range(max(done, 1), end)]
        gaps += [0.0] * self._together
        self._together = 0
        if gaps:
            observe_many(self._itl, gaps)

    # -- teardown ------------------------------------------------------------------
    async def _close_attempt(self, failure: BackendError | None = None) -> None:
        self._settle(time.monotonic())
        attempt, self.attempt = self.attempt, None
        if attempt is not None:
            await attempt.close(failure)  # shielded, bounded by CLOSE_TIMEOUT_S

    async def finish(self) -> StreamOutcome:
        """Close everything, then ``on_finish``; the stream's outcome and measurements
        (idempotent).

        Runs when :meth:`send_body` ends (normally, by error or cancelled) and again as
        the response's background task, for a response that never started its body.
        """
        if self._result is None:
            self._deadline.close()
            await self._close_attempt()
            self._result = result = self._measure()
            if self.failover.trace is not None:
                self._traced(result)
            on_finish, self.on_finish = self.on_finish, None
            if on_finish is not None:
                await on_finish(result)
        return self._result

    def _timeline(self) -> np.ndarray:
        """Each token's emission time (s since receipt): the (time, tokens) pairs expanded."""
        times = np.frombuffer(self.times, dtype=np.float64)
        return np.repeat(times, np.frombuffer(self.counts, dtype=np.int64))

    def _traced(self, result: StreamOutcome) -> None:
        """The stream's span ended, and the request's span told how it went: a completed
        stream's QoE, else the longest freeze of what was sent."""
        assert self.failover.trace is not None
        qoe: ReplyQoE | None = None
        longest: float | None = None
        if self.n_tokens:
            tier = self.ctx.tier
            try:
                if result.emissions is not None:
                    qoe = reply_qoe(self._timeline(), tier.ttft, tier.tds)
                    longest = qoe.freezes.longest_s
                else:
                    longest = freezes(self._timeline(), tier.tds).longest_s
            except ValueError as exc:  # cannot happen with monotonic times
                log.warning("QoE not computed: %s", exc)
        prompt = (self.usage or {}).get("prompt_tokens")
        prompt_tokens = prompt if isinstance(prompt, int) else None
        attributes = outcome_attributes(result, prompt_tokens, qoe, longest)
        self.failover.trace.set(attributes)
        if self._span is not None:
            self._span.set_attributes(attributes)
            end_span(self._span, result.error, "stream_error" if result.error else None)

    def _measure(self) -> StreamOutcome:
        tokens = self.n_tokens
        if self.usage is not None and isinstance(self.usage.get("completion_tokens"), int):
            tokens = self.usage["completion_tokens"]
        result = StreamOutcome(self.outcome, self.backend, tokens, error=self.error)
        if self.n_tokens:
            result.ttft_s = self.times[0]
            if self.outcome == "completed":
                result.emissions = Emissions(self.times, self.counts)
        return result
