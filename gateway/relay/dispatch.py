"""Sending a request to a backend, with failover before the first byte.

One loop for streaming and non-streaming requests (:meth:`Dispatcher.first_success`):
the router's best untried backend, then the next when an attempt fails in a way another
backend may not (``retryable``). The request's one hold (its admission ticket: the store
slot and the router lease) goes to each backend before it is tried; a backend whose
slots are full is passed over. A refusal that is the client's fault (a 4xx) is final and
relayed as it was; when no backend serving the model can take the request (all down, or
the others full) the answer is 503 ``backend_unavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio

from gateway.backends import Backend, BackendError, ChunkStream
from gateway.backends.routing import BackendState, Lease, Router
from gateway.config.schema import TimeoutsConfig
from gateway.context import RequestContext
from gateway.errors import SERVER_ERROR
from gateway.relay.tagging import upstream_body
from gateway.store import StoreUnavailable, store_unavailable
from gateway.telemetry.metrics import GatewayMetrics

log = logging.getLogger("tokenpace.gateway")

CLOSE_TIMEOUT_S = 1.0
T = TypeVar("T")


@dataclass(eq=False)
class Attempt:
    """A stream opened on one backend. ``lease`` is the request's share of that backend's
    load: its ticket's, counted down by the relay as tokens arrive, released with it."""

    state: BackendState
    lease: Lease
    stream: ChunkStream
    closed: bool = field(default=False)

    async def close(self) -> None:
        """Close the upstream stream (aborting the generation)."""
        if self.closed:
            return
        self.closed = True
        try:
            with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                await self.stream.aclose()
        except Exception:
            log.warning("closing the stream of backend %s failed", self.state.name, exc_info=True)


@dataclass(slots=True)
class Completed:
    """A non-streaming request's answer and the output tokens its usage reports."""

    backend: str
    result: dict[str, Any]
    tokens: int


class Dispatcher:
    """Attempts on the router's backends, in its order, until one succeeds."""

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

    async def first_success(
        self,
        raw: dict[str, Any],
        ctx: RequestContext,
        tried: list[str],
        call: Callable[[Backend, dict[str, Any]], Awaitable[T]],
        previous: BackendError | None = None,
    ) -> tuple[BackendState, T]:
        """``call`` on the best untried backend, failing over; raise :class:`BackendError`.

        Before each attempt the request's hold (``ctx.hold``) moves to that backend; one
        whose slots are full is passed over. ``tried`` collects the backends used, latest
        last. ``previous`` is the failure that led to this failover: raised again when no
        backend is left. The hold is the caller's to release, on every path.
        """
        hold = ctx.hold
        assert hold is not None, "a request is dispatched once admitted"
        router = self.router
        last = previous
        full: list[str] = []
        while (state := router.choose(ctx.model, [*tried, *full], hold.backend)) is not None:
            try:
                moved = await hold.move(state)
            except StoreUnavailable:
                down = store_unavailable()
                raise BackendError(
                    down.message,
                    status=down.status,
                    retryable=False,
                    body=down.body,
                    retry_after_s=float(down.headers["Retry-After"]),
                ) from None
            if not moved:
                full.append(state.name)
                continue
            tried.append(state.name)
            try:
                return state, await call(state.backend, upstream_body(raw, ctx, state.backend))
            except BackendError as exc:
                last = exc
            except Exception as exc:
                log.warning("backend %s raised %r", state.name, exc, exc_info=exc)
                last = BackendError(f"Backend {state.name!r} failed ({type(exc).__name__}).")
            router.report_failure(state, last)
            if not last.retryable:
                raise last
            self.metrics.failovers.labels(state.name).inc()
            log.info("backend %s failed before the first byte: %s", state.name, last.message)
        if last is None:
            raise BackendError(
                f"No backend is available for model `{ctx.model}`; try again shortly.",
                status=503,
                code="backend_unavailable",
                type=SERVER_ERROR,
            )
        raise self._exhausted(ctx.model, last, full)

    def _exhausted(self, model: str, last: BackendError, full: list[str]) -> BackendError:
        """The final error once every backend was tried or full: 503
        ``backend_unavailable`` with ``Retry-After`` rather than the last backend's 502
        when every backend serving ``model`` is down (what ``/readyz`` reports), or when
        the ones left had no free slot."""
        if not last.retryable:
            return last
        if not any(s.healthy for s in self.router.serving(model)):
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
            retry_after_s=self.retry_after_s,
        )

    async def open_stream(
        self,
        raw: dict[str, Any],
        ctx: RequestContext,
        tried: list[str],
        previous: BackendError | None = None,
    ) -> Attempt:
        """A streaming request admitted on the best untried backend."""
        t = self.timeouts
        wait = t.connect_s + t.first_byte_s

        async def open_on(backend: Backend, body: dict[str, Any]) -> ChunkStream:
            try:
                async with asyncio.timeout(wait):  # lighter than an anyio cancel scope
                    return await backend.open_stream(ctx.endpoint, body, ctx)
            except TimeoutError:
                raise BackendError(
                    f"Backend {backend.name!r} did not admit the request in time.",
                    status=504,
                    code="upstream_timeout",
                ) from None

        state, stream = await self.first_success(raw, ctx, tried, open_on, previous)
        assert ctx.hold is not None
        return Attempt(state, ctx.hold.lease, stream)

    async def complete(
        self, raw: dict[str, Any], ctx: RequestContext, tried: list[str]
    ) -> Completed:
        """A non-streaming request answered by the best backend that can."""

        async def complete_on(backend: Backend, body: dict[str, Any]) -> dict[str, Any]:
            return await backend.complete(ctx.endpoint, body, ctx)

        state, result = await self.first_success(raw, ctx, tried, complete_on)
        usage = result.get("usage")
        reported = usage.get("completion_tokens") if isinstance(usage, dict) else None
        tokens = 0
        with contextlib.suppress(TypeError, ValueError):
            tokens = int(reported or 0)
        return Completed(state.name, result, tokens)
