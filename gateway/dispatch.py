"""Sending a request to a backend, with failover before the first byte.

:func:`open_attempt` admits a streaming request on the best backend, moving on to the
next one when an attempt fails in a way another backend may not (``retryable``);
:func:`complete_with_failover` does the same for non-streaming requests. A refusal that
is the client's fault (a 4xx) is final and relayed as it was.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass, field
from typing import Any

import anyio

from gateway.backends import BackendError, BackendState, ChunkStream, Lease, RequestContext
from gateway.errors import SERVER_ERROR, GatewayError
from gateway.state import GatewayState
from gateway.tagging import upstream_body

log = logging.getLogger("tokenpace.gateway")

CLOSE_TIMEOUT_S = 1.0


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


def no_backend_error(model: str) -> GatewayError:
    return GatewayError(
        503,
        f"No backend is available for model `{model}`; try again shortly.",
        type=SERVER_ERROR,
        code="backend_unavailable",
    )


def final_error(exc: BackendError) -> GatewayError:
    """The answer to the client when ``exc`` ends the request."""
    headers = {}
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    return GatewayError(exc.status, exc.message, body=exc.body, headers=headers)


def _exhausted(gw: GatewayState, model: str, last: BackendError) -> BackendError:
    """The final error once every backend was tried: when every backend serving ``model``
    is down (what ``/readyz`` reports), 503 ``backend_unavailable`` with ``Retry-After``
    (the health-check period) rather than the last backend's 502."""
    serving = [s for s in gw.router.states if s.backend.serves(model)]
    if not last.retryable or any(s.healthy for s in serving):
        return last
    return BackendError(
        f"Every backend serving model `{model}` is down ({last.message}); try again shortly.",
        status=503,
        code="backend_unavailable",
        type=SERVER_ERROR,
        retry_after_s=gw.config.health.interval_s,
    )


def _unexpected(state: BackendState, exc: Exception) -> BackendError:
    log.warning("backend %s raised %r", state.name, exc, exc_info=exc)
    return BackendError(
        f"Backend {state.name!r} failed ({type(exc).__name__}).", code="upstream_error"
    )


async def open_attempt(
    gw: GatewayState,
    raw: dict[str, Any],
    ctx: RequestContext,
    tried: set[str],
    info: dict[str, Any] | None = None,
    previous: BackendError | None = None,
) -> Attempt:
    """Admit a streaming request on the best untried backend; raise :class:`BackendError`.

    ``tried`` collects the backends used; it lets a later failover skip them. ``info``
    (the request's log labels) gets the backend of the latest attempt. ``previous`` is
    the failure that led to this failover: raised again when no backend is left.
    """
    router = gw.router
    t = gw.config.timeouts
    last: BackendError | None = previous
    while (state := router.pick(ctx.model, tried, ctx.backend)) is not None:
        tried.add(state.name)
        if info is not None:
            info["backend"] = state.name
        lease = router.acquire(state, ctx.expected_tokens)
        admitted = False
        try:
            with anyio.fail_after(t.connect_s + t.first_byte_s):
                stream = await state.backend.open_stream(
                    ctx.endpoint, upstream_body(raw, ctx, state.backend), ctx
                )
            admitted = True
        except BackendError as exc:
            last = exc
        except TimeoutError:
            last = BackendError(
                f"Backend {state.name!r} did not admit the request in time.",
                status=504,
                code="upstream_timeout",
            )
        except Exception as exc:
            last = _unexpected(state, exc)
        finally:
            if not admitted:  # also when cancelled (the client went away)
                lease.release()
        if admitted:
            return Attempt(state, lease, stream)
        router.report_failure(state, last)
        if not last.retryable:
            raise last
        gw.metrics.failovers.labels(state.name).inc()
        log.info("backend %s failed before the first byte: %s", state.name, last.message)
    if last is None:
        raise BackendError(
            f"No backend is available for model `{ctx.model}`.",
            status=503,
            code="backend_unavailable",
            type=SERVER_ERROR,
        )
    raise _exhausted(gw, ctx.model, last)


async def complete_with_failover(
    gw: GatewayState, raw: dict[str, Any], ctx: RequestContext, info: dict[str, Any]
) -> dict[str, Any]:
    """Answer a non-streaming request; raise :class:`GatewayError` when none can."""
    router = gw.router
    tried: set[str] = set()
    last: BackendError | None = None
    while (state := router.pick(ctx.model, tried, ctx.backend)) is not None:
        tried.add(state.name)
        info["backend"] = state.name
        lease = router.acquire(state, ctx.expected_tokens)
        try:
            result = await state.backend.complete(
                ctx.endpoint, upstream_body(raw, ctx, state.backend), ctx
            )
        except BackendError as exc:
            last = exc
        except Exception as exc:
            last = _unexpected(state, exc)
        else:
            usage = result.get("usage")
            with contextlib.suppress(TypeError, ValueError, AttributeError):
                info["tokens"] = int(usage.get("completion_tokens") or 0)
            return result
        finally:
            lease.release()
        router.report_failure(state, last)
        if not last.retryable:
            raise final_error(last)
        gw.metrics.failovers.labels(state.name).inc()
        log.info("backend %s failed: %s", state.name, last.message)
    if last is None:
        raise no_backend_error(ctx.model)
    raise final_error(_exhausted(gw, ctx.model, last))
