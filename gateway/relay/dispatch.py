"""Sending a request to a backend, with failover before the first byte: its one home.

A request's attempts are a :class:`Failover` (one per request, from
:meth:`Dispatcher.failover`): the router's best untried backend, then the next when an
attempt fails in a way another backend may not (``retryable``). The first attempt
(:meth:`Failover.open_stream`, :meth:`Failover.complete`) and the relay, whose stream
failed before its first chunk reached the client (:meth:`Failover.open_stream` with the
failed attempt), go through the same loop, and every failed attempt is accounted in one
place (:meth:`Failover._failed`: the router hears of it, the failover is counted). The
request's one hold (its admission ticket: the store slot and the router lease) goes to
each backend before it is tried; a backend whose slots are full is passed over. A
refusal that is the client's fault (a 4xx) is final and relayed as it was; when no
backend serving the model can take the request (all down, or the others full) the
answer is 503 ``backend_unavailable``. Every error raised is the client's answer
(a :class:`~gateway.errors.GatewayError`). A traced request gets a span per attempt
(:mod:`gateway.telemetry.tracing`), ended when the attempt fails or its stream closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from gateway.admission.controller import Ticket
from gateway.backends import Backend, BackendError, ChunkStream
from gateway.backends.routing import BackendState, Router
from gateway.config.schema import TimeoutsConfig
from gateway.context import RequestContext
from gateway.errors import SERVER_ERROR
from gateway.relay.tagging import upstream_body
from gateway.store import StoreUnavailable, store_unavailable
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.tracing import RequestTrace, end_span

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger("tokenpace.gateway")

CLOSE_TIMEOUT_S = 1.0
T = TypeVar("T")


@dataclass(eq=False, slots=True)
class Attempt:
    """A stream opened on one backend (``span``: its trace's, when traced)."""

    state: BackendState
    stream: ChunkStream
    closed: bool = field(default=False)
    span: Span | None = None

    async def close(self, failure: BackendError | None = None) -> None:
        """Close the upstream stream (aborting the generation); ``failure``: why."""
        if self.closed:
            return
        self.closed = True
        try:
            with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                await self.stream.aclose()
        except Exception:
            log.warning("closing the stream of backend %s failed", self.state.name, exc_info=True)
        if self.span is not None:
            _end_attempt(self.span, failure)


def _end_attempt(span: Span, failure: BackendError | None) -> None:
    if failure is None:
        end_span(span)
    else:
        span.set_attribute("tokenpace.failover", failure.retryable)
        end_span(span, failure.message, failure.code or str(failure.status))


@dataclass(slots=True)
class Completed:
    """A non-streaming request's answer and the output tokens its usage reports."""

    backend: str
    result: dict[str, Any]
    tokens: int


class Dispatcher:
    """What every request's failover shares: the router, the metrics, the timeouts."""

    def __init__(
        self,
        router: Router,
        metrics: GatewayMetrics,
        timeouts: TimeoutsConfig,
        retry_after_s: float,
    ) -> None:
        self.router = router
        self.metrics = metrics
        self.timeouts = timeouts
        self.retry_after_s = retry_after_s  # when every backend is down: the health period

    def failover(
        self,
        raw: dict[str, Any],
        ctx: RequestContext,
        hold: Ticket,
        trace: RequestTrace | None = None,
    ) -> Failover:
        """The attempts of one admitted request: ``raw`` its client's body, ``hold`` its
        admission ticket (moved to each backend tried; the caller closes it), ``trace``
        its spans when traced."""
        return Failover(self, raw, ctx, hold, trace)


class Failover:
    """One request's attempts on the router's backends, in its order, until one succeeds."""

    __slots__ = ("_dispatcher", "_span", "_tried", "ctx", "hold", "raw", "trace")

    def __init__(
        self,
        dispatcher: Dispatcher,
        raw: dict[str, Any],
        ctx: RequestContext,
        hold: Ticket,
        trace: RequestTrace | None = None,
    ) -> None:
        self._dispatcher = dispatcher
        self.raw = raw
        self.ctx = ctx
        self.hold = hold
        self.trace = trace
        self._tried: list[str] = []  # the backends attempted, latest last
        self._span: Span | None = None  # the span of the latest attempt, when traced

    @property
    def backend(self) -> str | None:
        """The backend of the latest attempt (None before the first)."""
        return self._tried[-1] if self._tried else None

    async def open_stream(
        self, failed: Attempt | None = None, failure: BackendError | None = None
    ) -> Attempt:
        """A stream on the best backend that admits the request.

        ``failed``: the attempt whose stream just failed with ``failure`` before anything
        of it reached the client; accounted, then the next backend is tried (unseen by
        the client), or ``failure`` raised when it is final.
        """
        if failed is not None and failure is not None:
            self._failed(failed.state, failure)
        state, stream = await self._first_success(self._open_on, failure)
        return Attempt(state, stream, span=self._span)

    async def complete(self) -> Completed:
        """A non-streaming request answered by the best backend that can."""
        ctx = self.ctx

        async def complete_on(backend: Backend, body: dict[str, Any]) -> dict[str, Any]:
            return await backend.complete(ctx.endpoint, body, ctx)

        state, result = await self._first_success(complete_on)
        if self._span is not None:
            end_span(self._span)
        usage = result.get("usage")
        reported = usage.get("completion_tokens") if isinstance(usage, dict) else None
        tokens = 0
        with contextlib.suppress(TypeError, ValueError):
            tokens = int(reported or 0)
        return Completed(state.name, result, tokens)

    def report(self, state: BackendState, failure: BackendError) -> None:
        """A stream failed after its first chunk reached the client: no failover, but the
        router hears of it."""
        self._dispatcher.router.report_failure(state, failure)

    async def _open_on(self, backend: Backend, body: dict[str, Any]) -> ChunkStream:
        t = self._dispatcher.timeouts
        try:
            async with asyncio.timeout(t.connect_s + t.first_byte_s):  # lighter than anyio's
                return await backend.open_stream(self.ctx.endpoint, body, self.ctx)
        except TimeoutError:
            raise BackendError(
                f"Backend {backend.name!r} did not admit the request in time.",
                status=504,
                code="upstream_timeout",
            ) from None

    async def _first_success(
        self,
        call: Callable[[Backend, dict[str, Any]], Awaitable[T]],
        previous: BackendError | None = None,
    ) -> tuple[BackendState, T]:
        """``call`` on the best untried backend, failing over; raise the final error.

        Before each attempt the hold moves to that backend; one whose slots are full is
        passed over. ``previous`` is the failure that led to this failover: raised again
        when no backend is left.
        """
        router, ctx, hold = self._dispatcher.router, self.ctx, self.hold
        last = previous
        full: list[str] = []  # passed over in this round: no free slot
        while (state := router.choose(ctx.model, [*self._tried, *full], hold.backend)) is not None:
            try:
                moved = await hold.move(state)
            except StoreUnavailable as exc:
                raise store_unavailable(exc) from None
            if not moved:
                full.append(state.name)
                continue
            self._tried.append(state.name)
            body = upstream_body(self.raw, ctx, state.backend)
            try:
                if self.trace is None:
                    return state, await call(state.backend, body)
                return state, await self._traced(call, state, body)
            except BackendError as exc:
                last = exc
            except Exception as exc:
                log.warning("backend %s raised %r", state.name, exc, exc_info=exc)
                last = BackendError(f"Backend {state.name!r} failed ({type(exc).__name__}).")
            if self._span is not None:
                _end_attempt(self._span, last)
            self._failed(state, last)
        if last is None:
            raise BackendError(
                f"No backend is available for model `{ctx.model}`; try again shortly.",
                status=503,
                code="backend_unavailable",
                type=SERVER_ERROR,
            )
        raise self._exhausted(last, full)

    async def _traced(
        self,
        call: Callable[[Backend, dict[str, Any]], Awaitable[T]],
        state: BackendState,
        body: dict[str, Any],
    ) -> T:
        """``call`` in a span of its own (the HTTP client's span nests under it)."""
        assert self.trace is not None
        attempt = len(self._tried) - 1
        attributes: dict[str, str | int] = {"tokenpace.backend": state.name}
        attributes["tokenpace.attempt"] = attempt
        self._span = span = self.trace.start("tokenpace.backend_attempt", attributes)
        try:
            with self.trace.current(span):
                return await call(state.backend, body)
        except asyncio.CancelledError:  # the client went away: the attempt ends with it
            end_span(span, "cancelled", "cancelled")
            raise

    def _failed(self, state: BackendState, failure: BackendError) -> None:
        """An attempt on ``state`` failed before its first byte reached the client: the
        router hears of it; ``failure`` is raised when final, else the failover counted."""
        self._dispatcher.router.report_failure(state, failure)
        if not failure.retryable:
            raise failure
        self._dispatcher.metrics.failovers.labels(state.name).inc()
        log.info("backend %s failed before the first byte: %s", state.name, failure.message)

    def _exhausted(self, last: BackendError, full: list[str]) -> BackendError:
        """The final error once every backend was tried or full: 503
        ``backend_unavailable`` with ``Retry-After`` rather than the last backend's 502
        when every backend serving the model is down (what ``/readyz`` reports), or when
        the ones left had no free slot."""
        model = self.ctx.model
        if not last.retryable:
            return last
        if not any(s.healthy for s in self._dispatcher.router.serving(model)):
            reason = f"Every backend serving model `{model}` is down ({last.message})"
        elif full:
            reason = (
                f"{last.message} Every other backend serving model `{model}` is at its "
                "max_concurrent"
            )
        else:
            return last
        return BackendError(
            f"{reason}; try again shortly.",
            status=503,
            code="backend_unavailable",
            type=SERVER_ERROR,
            retry_after_s=self._dispatcher.retry_after_s,
        )
