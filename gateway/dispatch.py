"""Sending a request to a backend, with failover before the first byte.

One loop for streaming and non-streaming requests (:meth:`Dispatcher.first_success`):
the router's best untried backend, then the next when an attempt fails in a way another
backend may not (``retryable``). A refusal that is the client's fault (a 4xx) is final
and relayed as it was; when every backend serving the model is down the answer is 503
``backend_unavailable``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio

from gateway.backends import Backend, BackendError, ChunkStream
from gateway.config import TimeoutsConfig
from gateway.context import RequestContext
from gateway.errors import SERVER_ERROR
from gateway.metrics import GatewayMetrics
from gateway.routing import BackendState, Lease, Router
from gateway.tagging import upstream_body

log = logging.getLogger("tokenpace.gateway")

CLOSE_TIMEOUT_S = 1.0
T = TypeVar("T")


@dataclass(eq=False)
class Attempt:
    """A stream admitted on one backend, with its share of that backend's load."""

    state: BackendState
    lease: Lease
    stream: ChunkStream
    closed: bool = field(default=False)

    async def close(self) -> None:
        """Close the upstream stream (aborting the generation) and release the lease."""
        if self.closed:
            return
        self.closed = True
        try:
            with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                await self.stream.aclose()
        except Exception:
            log.warning("closing the stream of backend %s failed", self.state.name, exc_info=True)
        finally:
            self.lease.release()


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
    ) -> tuple[BackendState, Lease, T]:
        """``call`` on the best untried backend, failing over; raise :class:`BackendError`.

        ``tried`` collects the backends used, latest last. ``previous`` is the failure
        that led to this failover: raised again when no backend is left. The lease is the
        caller's to release; it is released here when the attempt fails or is cancelled.
        """
        router = self.router
        last = previous
        while (state := router.choose(ctx.model, tried, ctx.backend)) is not None:
            tried.append(state.name)
            lease = router.acquire(state, ctx.expected_tokens)
            succeeded = False
            try:
                result = await call(state.backend, upstream_body(raw, ctx, state.backend))
                succeeded = True
            except BackendError as exc:
                last = exc
            except Exception as exc:
                log.warning("backend %s raised %r", state.name, exc, exc_info=exc)
                last = BackendError(f"Backend {state.name!r} failed ({type(exc).__name__}).")
            finally:
                if not succeeded:  # also when cancelled (the client went away)
                    lease.release()
            if succeeded:
                return state, lease, result
            assert last is not None
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
        raise self._exhausted(ctx.model, last)

    def _exhausted(self, model: str, last: BackendError) -> BackendError:
        """The final error once every backend was tried: when every backend serving
        ``model`` is down (what ``/readyz`` reports), 503 ``backend_unavailable`` with
        ``Retry-After`` rather than the last backend's 502."""
        if not last.retryable or any(s.healthy for s in self.router.serving(model)):
            return last
        return BackendError(
            f"Every backend serving model `{model}` is down ({last.message}); try again shortly.",
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
                with anyio.fail_after(wait):
                    return await backend.open_stream(ctx.endpoint, body, ctx)
            except TimeoutError:
                raise BackendError(
                    f"Backend {backend.name!r} did not admit the request in time.",
                    status=504,
                    code="upstream_timeout",
                ) from None

        state, lease, stream = await self.first_success(raw, ctx, tried, open_on, previous)
        return Attempt(state, lease, stream)

    async def complete(
        self, raw: dict[str, Any], ctx: RequestContext, tried: list[str]
    ) -> Completed:
        """A non-streaming request answered by the best backend that can."""

        async def complete_on(backend: Backend, body: dict[str, Any]) -> dict[str, Any]:
            return await backend.complete(ctx.endpoint, body, ctx)

        state, lease, result = await self.first_success(raw, ctx, tried, complete_on)
        lease.release()
        usage = result.get("usage")
        reported = usage.get("completion_tokens") if isinstance(usage, dict) else None
        tokens = 0
        with contextlib.suppress(TypeError, ValueError):
            tokens = int(reported or 0)
        return Completed(state.name, result, tokens)
