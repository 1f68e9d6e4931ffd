"""The backend seam: an engine (remote or in-process) that answers OpenAI requests.

The gateway talks to a :class:`Backend` in OpenAI chunks (``dict``), so an in-process
engine plugs in the same way as a remote vLLM. :meth:`Backend.open_stream` returns a
:class:`ChunkStream` of batches (:class:`Batch`: the chunks that arrived together, their
event bytes, a remote engine's relayed as read, and their tokens, counted once);
:meth:`Backend.complete` the whole JSON object. Raise :class:`BackendError` for a
refusal; ``retryable=True`` lets the gateway fail over. :class:`InProcessBackend` is
the short way for an engine in this process: implement ``generate()``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from gateway.backends.aggregate import aggregate_chunks
from gateway.backends.cancel_safe import ShieldedSteps
from gateway.backends.chunk import ChunkView, read_chunk
from gateway.config.schema import GatewayConfig
from gateway.context import Endpoint, RequestContext
from gateway.errors import UPSTREAM_ERROR, GatewayError
from qos.signals import ReaderSignal

ENDPOINT_PATHS: dict[str, str] = {
    "chat.completions": "chat/completions",
    "completions": "completions",
}


class BackendError(GatewayError):
    """A backend refused or failed a request: the answer the client gets when it is final.

    ``retryable``: another backend may succeed (connection refused, 5xx, timeout,
    garbage); the gateway fails over when nothing was sent to the client yet.
    ``status`` and ``body`` are what the client gets when it is the final answer
    (``body`` defaults to OpenAI's error shape with ``message``).
    ``unhealthy``: evidence that the backend is down, not just this request; the router
    stops choosing it until a health check passes. ``retry_after_s``: sent as
    ``Retry-After`` (whole seconds, at least 1) when this is the final answer.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 502,
        retryable: bool = True,
        body: dict[str, Any] | None = None,
        code: str = "upstream_error",
        type: str = UPSTREAM_ERROR,
        unhealthy: bool = False,
        retry_after_s: float | None = None,
    ) -> None:
        headers = {}
        if retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
        super().__init__(status, message, type=type, code=code, headers=headers, body=body)
        self.retryable = retryable
        self.unhealthy = unhealthy
        self.retry_after_s = retry_after_s


@dataclass(slots=True)
class Batch:
    """Chunks that arrived together, as the relay sends them: in one write.

    No chunks: the stream ended. :meth:`of` counts the tokens.
    """

    payloads: list[bytes] = field(default_factory=list)  # each chunk's JSON
    data: bytes = b""  # their SSE events, as the client gets them
    tokens: int = 0  # output tokens they deliver (:meth:`ChunkView.tokens`)
    token_chunks: int = 0  # how many of them deliver tokens
    usage: dict[str, Any] | None = None  # the last ``usage`` among them

    @classmethod
    def of(cls, payloads: list[bytes], views: list[ChunkView], data: bytes, counted: int) -> Batch:
        """The chunks ``payloads`` (non-empty; ``views``: :func:`read_chunk` of each),
        sent as ``data``; ``counted``: their stream's tokens before them."""
        tokens = token_chunks = 0
        usage = None
        for view in views:
            n = view.tokens(counted + tokens)
            if n:
                tokens += n
                token_chunks += 1
            if view.usage is not None:
                usage = view.usage
        return cls(payloads, data, tokens, token_chunks, usage)

    @property
    def chunks(self) -> list[dict[str, Any]]:
        """The chunks, decoded whole (for a caller that reads more than the relay)."""
        return [orjson.loads(p) for p in self.payloads]


class ChunkStream(ABC):
    """An admitted streaming request: OpenAI chunks, in batches as they arrive.

    The end comes after the last chunk (the gateway adds ``data: [DONE]``).
    :meth:`aclose` must stop the generation and release its resources; the gateway
    always calls it, also after a normal end, so make it idempotent.
    """

    @abstractmethod
    async def next_batch(self) -> Batch:
        """The chunks that have arrived: at least one (waiting for it), none at the end.

        A remote stream returns every event one socket read brought, so under load the
        relay handles (and sends) several chunks at once. Must be cancel-safe: the
        relay waits with a deadline (pings, timeouts), and a call cancelled while
        waiting must lose nothing, so that the next call returns what arrived.
        """

    @abstractmethod
    async def aclose(self) -> None: ...

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        """Every chunk, one at a time (for a caller that does not relay them)."""
        while chunks := (await self.next_batch()).chunks:
            for chunk in chunks:
                yield chunk


class GeneratorChunkStream(ChunkStream):
    """A :class:`ChunkStream` over an async generator (closing it closes the generator).

    The generator is stepped in :class:`~gateway.backends.cancel_safe.ShieldedSteps`, so a
    cancelled :meth:`next_batch` does not end it: the next call picks up the chunk.
    """

    def __init__(self, agen: AsyncIterator[dict[str, Any]]) -> None:
        self._agen = agen
        self._steps = ShieldedSteps(agen)
        self._counted = 0  # tokens delivered so far
        self._closed = False

    async def next_batch(self) -> Batch:
        try:
            chunk = await self._steps.next()
        except StopAsyncIteration:
            return Batch()
        if not isinstance(chunk, dict):
            raise BackendError("The backend sent a chunk that is not an object.")
        payload = orjson.dumps(chunk)
        try:
            view = read_chunk(payload)
        except ValueError as exc:
            raise BackendError(f"The backend sent a chunk of the wrong shape: {exc}.") from exc
        batch = Batch.of([payload], [view], b"data: " + payload + b"\n\n", self._counted)
        self._counted += batch.tokens
        return batch

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._steps.cancel()  # CancelledError at the generator's await: it stops
        aclose = getattr(self._agen, "aclose", None)
        if aclose is not None:
            await aclose()


@dataclass
class BackendRuntime:
    """What the gateway hands every backend at start-up."""

    http: httpx.AsyncClient
    config: GatewayConfig


class Backend(ABC):
    """An engine (remote or in-process) that serves some models."""

    name: str
    models: tuple[str, ...]
    tokenpace: bool = False  # runs the tokenpace scheduler: send vllm_xargs tags
    supports_priority: bool = False  # accepts vLLM's `priority`
    throughput_tps: float | None = None  # Θ for the waiting-time estimate; None = default

    def serves(self, model: str) -> bool:
        return "*" in self.models or model in self.models

    def model_card(self, model: str) -> dict[str, Any]:
        """Extra fields of ``model``'s ``/v1/models`` entry (e.g. ``owned_by``); none here."""
        return {}

    async def start(self, runtime: BackendRuntime) -> None:
        """Called once when the gateway starts (the app's lifespan)."""

    async def aclose(self) -> None:
        """Called once when the gateway stops."""

    async def check_health(self) -> bool:
        """True when the backend can take requests (called every ``health.interval_s``)."""
        return True

    @property
    def probes_capacity(self) -> bool:
        """:meth:`saturated` reads the engine's own report (polled by admission)."""
        return False

    async def saturated(self) -> bool:
        """The engine reports no room for another request (its KV cache, its queue)."""
        return False

    def reader_signal(self, request_id: str, signal: ReaderSignal) -> bool:
        """Hand an engine in this process what the client of ``request_id`` said of its
        reader; False when this backend's engine is not here to hear it (a vLLM engine
        hears the store's channel itself, :mod:`qos.vllm.reader_channel`)."""
        return False

    @abstractmethod
    async def open_stream(
        self, endpoint: Endpoint, body: dict[str, Any], ctx: RequestContext
    ) -> ChunkStream:
        """Admit a streaming request (``body`` is already tagged for this backend)."""

    @abstractmethod
    async def complete(
        self, endpoint: Endpoint, body: dict[str, Any], ctx: RequestContext
    ) -> dict[str, Any]:
        """Answer a non-streaming request with the whole OpenAI response object."""


class InProcessBackend(Backend):
    """Base for an engine in this process: implement :meth:`generate`, get the rest.

    ``generate`` yields OpenAI chunk dicts for a streaming request (honouring
    ``stream_options.include_usage`` in ``body``); raising :class:`BackendError` before
    the first chunk lets the gateway fail over. Cancellation (the client went away)
    arrives as ``CancelledError`` at an ``await`` or ``GeneratorExit`` at a ``yield``.
    """

    def __init__(
        self,
        name: str,
        models: Iterable[str],
        *,
        tokenpace: bool = True,
        supports_priority: bool = False,
        throughput_tps: float | None = None,
    ) -> None:
        self.name = name
        self.models = tuple(models)
        self.tokenpace = tokenpace
        self.supports_priority = supports_priority
        self.throughput_tps = throughput_tps

    @abstractmethod
    def generate(
        self, endpoint: Endpoint, body: dict[str, Any], ctx: RequestContext
    ) -> AsyncIterator[dict[str, Any]]:
        """Async generator of OpenAI chunks for this request."""

    async def admit(self, endpoint: Endpoint, body: dict[str, Any], ctx: RequestContext) -> None:
        """Refuse a request before the response starts (raise :class:`BackendError`)."""

    async def open_stream(
        self, endpoint: Endpoint, body: dict[str, Any], ctx: RequestContext
    ) -> ChunkStream:
        await self.admit(endpoint, body, ctx)
        return GeneratorChunkStream(self.generate(endpoint, body, ctx))

    async def complete(
        self, endpoint: Endpoint, body: dict[str, Any], ctx: RequestContext
    ) -> dict[str, Any]:
        stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        stream = await self.open_stream(endpoint, stream_body, ctx)
        try:
            return aggregate_chunks(endpoint, [chunk async for chunk in stream.chunks()])
        finally:
            await stream.aclose()
