"""The completion request path: checks, tier, admission, dispatch, the response.

After authentication (:mod:`gateway.http`): the body parsed and validated against the
models of :mod:`gateway.request.schemas` (:func:`~gateway.request.body.parse_body`),
within the configured caps and encodable for the backend (400), the tier
(:mod:`gateway.request.tiers`, 400/403), the model (404), admission
(:mod:`gateway.admission`: 429, 503 ``overloaded``, or a wait in the queue for a backend
slot, held until the response ends), then the backend: streaming through
:class:`~gateway.relay.streaming.StreamRelay` in a
:class:`~gateway.relay.response.RelayResponse`, non-streaming through
:meth:`~gateway.relay.dispatch.Failover.complete`, both with failover before the
first byte. A stream that must wait is answered at once in ``admission.overload:
queue`` mode, its body first telling it where it stands
(:class:`~gateway.relay.queued.QueuedRelay`). A request still unanswered when the
gateway's drain runs out gets 503 ``server_shutting_down`` (:mod:`gateway.relay.drain`).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.admission.controller import AdmissionController, Ticket, Waiting
from gateway.backends.routing import Router
from gateway.config.schema import GatewayConfig, TenantConfig
from gateway.context import Endpoint, RequestContext, RequestRecord, StreamOutcome
from gateway.errors import INVALID_REQUEST, GatewayError
from gateway.relay.disconnect import ClientGone, DisconnectWatch, ShuttingDown
from gateway.relay.dispatch import Attempt, Dispatcher, Failover
from gateway.relay.drain import Drain, shutting_down
from gateway.relay.queued import QueuedRelay
from gateway.relay.reader import ReaderChannel
from gateway.relay.response import RelayResponse
from gateway.relay.streaming import StreamRelay
from gateway.request.body import check_forwardable, check_limits, parse_body
from gateway.request.schemas import ChatCompletionRequest, CompletionRequest
from gateway.request.tiers import TIER_HEADER, resolve_tier
from gateway.telemetry.metrics import GatewayMetrics, series
from gateway.telemetry.reports import Telemetry
from gateway.telemetry.tokens import TelemetryTokens
from gateway.telemetry.tracing import (
    TRACING_OFF,
    RequestTrace,
    Tracing,
    outcome_attributes,
    request_attributes,
    span_of,
)
from qos.prompt_tokens import estimate_prompt_tokens

# What each endpoint's body is validated as.
_MODELS: dict[Endpoint, type[ChatCompletionRequest] | type[CompletionRequest]] = {
    "chat.completions": ChatCompletionRequest,
    "completions": CompletionRequest,
}


def model_not_found(model: str) -> GatewayError:
    # OpenAI's exact wording and code for an unknown model.
    return GatewayError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        type=INVALID_REQUEST,
        param="model",
        code="model_not_found",
    )


class CompletionService:
    """Serves ``/v1/chat/completions`` and ``/v1/completions`` (see the module docstring)."""

    def __init__(
        self,
        config: GatewayConfig,
        router: Router,
        admission: AdmissionController,
        dispatcher: Dispatcher,
        telemetry: Telemetry,
        tokens: TelemetryTokens,
        metrics: GatewayMetrics,
        drain: Drain,
        readers: ReaderChannel,
        tracing: Tracing = TRACING_OFF,
    ) -> None:
        self.config = config  # the tiers (resolve_tier), limits, routing and timeouts
        self.drain = drain  # the gateway's stop: requests and streams still open end
        self.readers = readers  # reader signals reach the streams relayed here
        self.router = router
        self.admission = admission
        self.dispatcher = dispatcher
        self.telemetry = telemetry
        self.tokens = tokens
        self.metrics = metrics
        self.tracing = tracing
        self.default_tokens = config.routing.expected_output_tokens
        self._tokens = series(metrics.tokens)
        self._queued = series(metrics.queued_with_notice)

    async def serve(
        self, request: Request, record: RequestRecord, endpoint: Endpoint, tenant: TenantConfig
    ) -> Response:
        headers: dict[str, str] = {}
        try:
            # ``raw``, the JSON as the client wrote it, is the base of the upstream body;
            # every decision below reads the validated ``body``
            raw, body = parse_body(await request.body(), _MODELS[endpoint])
            check_forwardable(raw)
            check_limits(body, self.config.limits)
            options = body.tokenpace.model_dump(exclude_unset=True) if body.tokenpace else None
            tier = resolve_tier(self.config, tenant, request.headers.get(TIER_HEADER), options)
            record.tier = tier.name
            headers = tier.headers()
            record.model = model = body.model
            if not self.router.knows_model(model):
                raise model_not_found(model)
        except GatewayError as exc:  # refused before admission: counted all the same
            refusal = await self.admission.refused(tenant, exc)
            refusal.headers = {**headers, **refusal.headers}
            raise refusal from None
        try:
            ctx = RequestContext(
                request_id=record.request_id,
                tenant=tenant.name,
                weight=tenant.weight,
                tier=tier,
                endpoint=endpoint,
                model=model,
                stream=bool(body.stream),
                received_at=record.received_at,
                expected_tokens=self._expected_tokens(body),
                max_output_tokens=self._max_output_tokens(body),
            )
            trace = None
            if self.tracing.on:
                max_tokens = getattr(body, "max_completion_tokens", None) or body.max_tokens
                trace = self.tracing.request(request_attributes(ctx, max_tokens, body.n or 1))
            watch = DisconnectWatch(request.receive)
            self.drain.add(watch)
            response: Response | None = None
            try:
                response = await self._admitted(watch, raw, ctx, tenant, record, headers, trace)
                return response
            except ShuttingDown:
                raise shutting_down() from None
            finally:
                self.drain.discard(watch)  # a stream's body the relay ends at the drain
                if not isinstance(response, RelayResponse):  # else the response's to close
                    await watch.close()
        except GatewayError as exc:
            exc.headers = {**headers, **exc.headers}
            raise

    async def _admitted(
        self,
        watch: DisconnectWatch,
        raw: dict[str, Any],
        ctx: RequestContext,
        tenant: TenantConfig,
        record: RequestRecord,
        headers: dict[str, str],
        trace: RequestTrace | None,
    ) -> Response:
        """Admission, then the backend; ``headers`` gain the admission's."""
        token = await self.tokens.header(ctx.request_id, tenant.name)
        routed = self.router.routed(raw, ctx)
        prompt_tokens = routed.prompt.tokens if routed is not None else estimate_prompt_tokens(raw)
        arrive = self.admission.arrive(ctx, tenant, prompt_tokens, routed)
        queued_stream = ctx.stream and self.config.admission.overload == "queue"
        try:
            with span_of(trace, "tokenpace.admission"):
                entered = await watch.run(arrive)
                if isinstance(entered, Waiting) and not queued_stream:
                    entered = await watch.run(entered.ticket())
        except ClientGone:
            return client_gone(record)
        headers.update(entered.rate.headers())
        headers.update(token)
        if isinstance(entered, Waiting):
            return await self._queued_stream(watch, entered, raw, ctx, record, headers, trace)
        # from here every path closes the ticket (no await until _stream/_complete); the
        # failover moves it on in the router's order
        failover = self.dispatcher.failover(raw, ctx, entered, trace)
        if ctx.stream:
            return await self._stream(watch, failover, record, headers)
        return await self._complete(watch, failover, record, headers)

    def _expected_tokens(self, body: ChatCompletionRequest | CompletionRequest) -> int:
        """Output tokens expected (QLM's estimate): ``max_tokens`` capped by
        ``routing.expected_output_tokens``, times ``n``."""
        expected = self.default_tokens
        for value in (getattr(body, "max_completion_tokens", None), body.max_tokens):
            if value is not None:
                expected = min(expected, value)
        return expected * (body.n or 1)

    def _max_output_tokens(self, body: ChatCompletionRequest | CompletionRequest) -> int:
        """The most output tokens the request allows: its ``max_completion_tokens`` or
        ``max_tokens``, else ``limits.max_tokens``, times ``n``. A backend that ignores
        the request's limit is cut there (the relay)."""
        limit = getattr(body, "max_completion_tokens", None) or body.max_tokens
        return (limit or self.config.limits.max_tokens) * (body.n or 1)

    def _count_tokens(self, ctx: RequestContext, backend: str, tokens: int) -> None:
        """The one place output tokens are counted (streams and whole responses)."""
        if tokens:
            self._tokens(ctx.tenant, ctx.tier.name, backend).inc(tokens)

    async def _stream(
        self,
        watch: DisconnectWatch,
        failover: Failover,
        record: RequestRecord,
        headers: dict[str, str],
    ) -> Response:
        ticket = failover.hold
        try:
            attempt = await watch.run(failover.open_stream())
        except GatewayError:
            record.backend = failover.backend or record.backend
            await ticket.close()
            raise
        except ClientGone:
            record.backend = failover.backend or record.backend
            await ticket.close()
            return client_gone(record)
        except BaseException:
            await ticket.close()
            raise
        record.backend = attempt.state.name
        relay = self._relay(failover, attempt, record)
        try:
            return RelayResponse(relay, headers, watch)
        except BaseException:
            await relay.finish()
            raise

    def _relay(self, failover: Failover, attempt: Attempt, record: RequestRecord) -> StreamRelay:
        """The relay of a stream opened by ``attempt``; when it ends: the record, the
        tokens, the slot back."""
        ctx, ticket = failover.ctx, failover.hold

        async def finished(result: StreamOutcome) -> None:
            """Once, after the relay's teardown."""
            record.finished_stream(result)
            self._count_tokens(ctx, result.backend, result.tokens)
            self.telemetry.record_stream(ctx, result)
            await ticket.close()

        return StreamRelay(
            failover,
            self.metrics,
            self.config.timeouts,
            attempt,
            self.drain,
            self.readers,
            on_finish=finished,
        )

    async def _queued_stream(
        self,
        watch: DisconnectWatch,
        waiting: Waiting,
        raw: dict[str, Any],
        ctx: RequestContext,
        record: RequestRecord,
        headers: dict[str, str],
        trace: RequestTrace | None,
    ) -> Response:
        """A stream answered 200 while it waits: queue notices, then the relay."""

        async def start(ticket: Ticket) -> StreamRelay:
            failover = self.dispatcher.failover(raw, ctx, ticket, trace)
            try:
                attempt = await failover.open_stream()
            except BaseException:
                record.backend = failover.backend or record.backend
                await ticket.close()
                raise
            record.backend = attempt.state.name
            return self._relay(failover, attempt, record)

        def failed(exc: GatewayError) -> None:
            record.outcome = "error"
            record.error = exc.message

        def left() -> None:
            record.outcome = "aborted"

        body = QueuedRelay(waiting, start, failed, left, self.drain, self.readers)
        try:
            response = RelayResponse(body, headers, watch)
        except BaseException:
            await waiting.abandon()
            raise
        self._queued(ctx.tenant, ctx.tier.name).inc()
        return response

    async def _complete(
        self,
        watch: DisconnectWatch,
        failover: Failover,
        record: RequestRecord,
        headers: dict[str, str],
    ) -> Response:
        ctx, ticket = failover.ctx, failover.hold
        tokens = 0
        try:
            done = await watch.run(failover.complete())
            tokens = done.tokens
        except ClientGone:
            return client_gone(record)
        finally:
            record.backend = failover.backend or record.backend
            ticket.tokens(tokens)
            await ticket.close()
        record.tokens = tokens
        self._count_tokens(ctx, done.backend, tokens)
        if failover.trace is not None:
            usage = done.result.get("usage")
            prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
            outcome = StreamOutcome("completed", done.backend, tokens)
            prompt_tokens = prompt if isinstance(prompt, int) else None
            failover.trace.set(outcome_attributes(outcome, prompt_tokens, None, None))
        return JSONResponse(done.result, headers=headers)


def client_gone(record: RequestRecord) -> Response:
    record.outcome = "aborted"
    return Response(status_code=499)  # nginx's "client closed request": never seen by anyone
