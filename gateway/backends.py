"""Backends: the engines a request can be routed to, and the router that picks one.

The seam
--------
A :class:`Backend` answers OpenAI requests for some models. The gateway talks to it in
OpenAI chunks (``dict``), so an in-process engine plugs in the same way as a remote
vLLM (which also hands over each chunk's event bytes, relayed unchanged):

- :meth:`Backend.open_stream` admits a streaming request and returns a
  :class:`ChunkStream` (``await stream.next_batch()`` gives the ``chat.completion.chunk``
  / ``text_completion`` dicts that have arrived; ``await stream.aclose()`` cancels the
  generation). Raise :class:`BackendError` for a refusal; ``retryable=True`` lets the
  gateway fail over to another backend, which it also does when the stream fails
  before its first chunk.
- :meth:`Backend.complete` answers a non-streaming request with the whole JSON object.
- :meth:`Backend.check_health`, :meth:`Backend.start`, :meth:`Backend.aclose`.

:class:`InProcessBackend` is the short way for an engine living in this process:
implement ``generate()`` as an async generator of chunks and it gets ``open_stream``
and ``complete`` (the chunks aggregated into one response) for free. Engines built from
configuration register a factory with :func:`register_backend_kind`.

:class:`HttpBackend` relays to an OpenAI-compatible server over one shared
``httpx.AsyncClient`` (a connection pool per backend origin, see
:func:`build_http_client`).

Routing
-------
:class:`Router` sends each request to the healthy backend with the least outstanding
work, measured as QLM's request waiting time estimate (Patke et al., §6, Eq. 2;
:func:`qos.queueing.request_waiting_time`): the output tokens still expected from the
requests already on that backend, divided by its token throughput Θ. A request's
expected output is its ``max_tokens`` capped by ``routing.expected_output_tokens``
(QLM uses the mean output length for the queue), and shrinks as its tokens stream back.
Ties go to the backend with fewer requests in flight, then round robin in configuration
order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import httpx
import orjson

from gateway import config as config_mod
from gateway.cancel_safe import ShieldedSteps
from gateway.config import BackendConfig, GatewayConfig, HealthConfig, TimeoutsConfig
from gateway.errors import TIMEOUT, UPSTREAM_ERROR, error_body
from gateway.tiers import ResolvedTier
from gateway.upstream import UpstreamTransport, body_reader
from qos.queueing import request_waiting_time

log = logging.getLogger("tokenpace.gateway")

Endpoint = Literal["chat.completions", "completions"]
ENDPOINT_PATHS: dict[str, str] = {
    "chat.completions": "chat/completions",
    "completions": "completions",
}
_MAX_ERROR_BODY = 64 * 1024
_DRAIN_S = 0.25  # longest wait for the end of a stream's body after [DONE]
DEFAULT_MAX_CONNECTIONS = 100  # to an origin no backend names (none, normally)


@dataclass(slots=True)
class RequestContext:
    """What the gateway decided about a request, handed to the backend with the body."""

    request_id: str
    tenant: str
    weight: float
    tier: ResolvedTier
    endpoint: Endpoint
    model: str
    stream: bool
    received_at: float  # time.monotonic() when the gateway received the request
    expected_tokens: int  # output tokens expected, for the waiting-time estimate
    backend: str | None = None  # the backend admission reserved a slot on: tried first


class BackendError(Exception):
    """A backend refused or failed a request.

    ``retryable``: another backend may succeed (connection refused, 5xx, timeout,
    garbage); the gateway fails over when nothing was sent to the client yet.
    ``status`` and ``body`` are what the client gets when it is the final answer
    (``body`` defaults to OpenAI's error shape with ``message``).
    ``unhealthy``: evidence that the backend is down, not just this request; the router
    stops choosing it until a health check passes. ``retry_after_s``: sent as
    ``Retry-After`` when this is the final answer.
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
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s
        self.status = status
        self.retryable = retryable
        self.code = code
        self.type = type
        self.unhealthy = unhealthy
        self._body = body

    @property
    def body(self) -> dict[str, Any]:
        if self._body is not None:
            return self._body
        return error_body(self.message, self.type, None, self.code)


Chunk = tuple[dict[str, Any], bytes | None]
"""One OpenAI chunk and its SSE event as received (relayed unchanged), or ``None`` (the
gateway encodes the chunk)."""


class ChunkStream(ABC):
    """An admitted streaming request: OpenAI chunk dicts, in batches as they arrive.

    The end comes after the last chunk (the gateway adds ``data: [DONE]``).
    :meth:`aclose` must stop the generation and release its resources; the gateway
    always calls it, also after a normal end, so make it idempotent.
    """

    @abstractmethod
    async def next_batch(self) -> list[Chunk]:
        """The chunks that have arrived: at least one (waiting for it), or ``[]`` at the end.

        A remote stream returns every event one socket read brought, so under load the
        relay handles (and sends) several chunks at once. Must be cancel-safe: the
        relay waits with a deadline (pings, timeouts), and a call cancelled while
        waiting must lose nothing, so that the next call returns what arrived.
        """

    @abstractmethod
    async def aclose(self) -> None: ...

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        """Every chunk, one at a time (for a caller that does not relay them)."""
        while batch := await self.next_batch():
            for chunk, _ in batch:
                yield chunk


class GeneratorChunkStream(ChunkStream):
    """A :class:`ChunkStream` over an async generator (closing it closes the generator).

    The generator is stepped in :class:`~gateway.cancel_safe.ShieldedSteps`, so a
    cancelled :meth:`next_batch` does not end it: the next call picks up the chunk.
    """

    def __init__(self, agen: AsyncIterator[dict[str, Any]]) -> None:
        self._agen = agen
        self._steps = ShieldedSteps(agen)
        self._closed = False

    async def next_batch(self) -> list[Chunk]:
        try:
            chunk = await self._steps.next()
        except StopAsyncIteration:
            return []
        if not isinstance(chunk, dict):
            raise BackendError("The backend sent a chunk that is not an object.")
        return [(chunk, None)]

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


def aggregate_chunks(endpoint: Endpoint, chunks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Fold a stream's chunks into the non-streaming response OpenAI would have sent."""
    first = chunks[0] if chunks else {}
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    for chunk in chunks:
        if chunk.get("usage"):
            usage = chunk["usage"]
        for ch in chunk.get("choices") or ():
            idx = int(ch.get("index", 0))
            if endpoint == "completions":
                acc = choices.setdefault(
                    idx, {"index": idx, "text": "", "logprobs": None, "finish_reason": None}
                )
                acc["text"] += ch.get("text") or ""
            else:
                acc = choices.setdefault(
                    idx,
                    {
                        "index": idx,
                        "message": {"role": "assistant", "content": None},
                        "logprobs": None,
                        "finish_reason": None,
                    },
                )
                _merge_delta(acc["message"], ch.get("delta") or {})
            if ch.get("finish_reason") is not None:
                acc["finish_reason"] = ch["finish_reason"]
    out = {
        "id": first.get("id", ""),
        "object": "text_completion" if endpoint == "completions" else "chat.completion",
        "created": first.get("created", int(time.time())),
        "model": first.get("model", ""),
        "choices": [choices[i] for i in sorted(choices)],
    }
    if usage is not None:
        out["usage"] = usage
    return out


def _merge_delta(message: dict[str, Any], delta: dict[str, Any]) -> None:
    for key, value in delta.items():
        if key == "role":
            message["role"] = value
        elif key == "tool_calls":
            calls = message.setdefault("tool_calls", [])
            for call in value or ():
                i = call.get("index", len(calls))
                while len(calls) <= i:
                    calls.append(
                        {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                    )
                target = calls[i]
                if call.get("id"):
                    target["id"] = call["id"]
                if call.get("type"):
                    target["type"] = call["type"]
                fn = call.get("function") or {}
                if fn.get("name"):
                    target["function"]["name"] += fn["name"]
                if fn.get("arguments"):
                    target["function"]["arguments"] += fn["arguments"]
        elif isinstance(value, str):
            message[key] = (message.get(key) or "") + value
        elif value is not None:
            message[key] = value


# ---------------------------------------------------------------------------------
# HTTP backends


def _origin(url: str) -> str:
    u = httpx.URL(url)
    return f"{u.scheme}://{u.host}" + (f":{u.port}" if u.port else "")


def build_http_client(config: GatewayConfig) -> httpx.AsyncClient:
    """The one shared client: an aiohttp connection pool per backend origin.

    (gateway/upstream.py says why aiohttp carries the bytes.) Two backends behind one
    origin share its pool, sized by the larger of their ``max_connections``.
    """
    t = config.timeouts
    timeout = httpx.Timeout(
        connect=t.connect_s, read=t.request_s, write=t.connect_s, pool=t.connect_s
    )
    max_by_origin: dict[str, int] = {}
    for b in config.backends:
        if b.kind == "http" and b.url:
            origin = _origin(b.url)
            max_by_origin[origin] = max(max_by_origin.get(origin, 0), b.max_connections)
    mounts: dict[str, httpx.AsyncBaseTransport | None] = {
        origin: upstream_transport(n) for origin, n in max_by_origin.items()
    }
    return httpx.AsyncClient(
        timeout=timeout,
        transport=upstream_transport(DEFAULT_MAX_CONNECTIONS),
        mounts=mounts,
        follow_redirects=False,
        trust_env=False,
    )


def upstream_transport(max_connections: int) -> UpstreamTransport:
    """The transport of one backend origin, as the gateway configures it."""
    # Idle connections expire before uvicorn's default 5 s keep-alive (vLLM's server)
    # closes them: reusing one the server already closed fails the request.
    return UpstreamTransport(max_connections=max_connections, keepalive_expiry=4.0)


def _is_openai_error(body: Any) -> bool:
    return isinstance(body, dict) and isinstance(body.get("error"), dict)


class HttpBackend(Backend):
    """An OpenAI-compatible server reached over HTTP (vLLM, or any other)."""

    def __init__(self, cfg: BackendConfig, timeouts: TimeoutsConfig, health: HealthConfig) -> None:
        assert cfg.url is not None
        self.name = cfg.name
        self.models = tuple(cfg.models)
        self.tokenpace = cfg.tokenpace
        self.supports_priority = cfg.supports_priority
        self.throughput_tps = cfg.throughput_tps
        self.base_url = cfg.url
        self._timeouts = timeouts
        self._health = health
        path = cfg.health_path
        if path.startswith("/"):
            self.health_url = _origin(cfg.url) + path
        else:
            self.health_url = f"{cfg.url}/{path}"
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        key = cfg.resolved_api_key()
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        # Parsed once: httpx's URL parsing was a tenth of the gateway's CPU per request.
        self._urls = {e: httpx.URL(f"{cfg.url}/{path}") for e, path in ENDPOINT_PATHS.items()}
        self._client: httpx.AsyncClient | None = None

    @classmethod
    def from_config(cls, cfg: BackendConfig, config: GatewayConfig) -> HttpBackend:
        return cls(cfg, config.timeouts, config.health)

    async def start(self, runtime: BackendRuntime) -> None:
        self._client = runtime.http

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError(f"backend {self.name!r} used before the gateway started")
        return self._client

    def url_for(self, endpoint: Endpoint) -> httpx.URL:
        return self._urls[endpoint]

    def _request_headers(self, ctx: RequestContext) -> dict[str, str]:
        return {**self._headers, "X-Request-Id": ctx.request_id}

    async def check_health(self) -> bool:
        auth = {k: v for k, v in self._headers.items() if k == "Authorization"}
        try:
            resp = await self.client.get(
                self.health_url, headers=auth, timeout=self._health.timeout_s
            )
        except httpx.HTTPError:
            return False
        return 200 <= resp.status_code < 300

    def _transport_error(self, exc: Exception, what: str) -> BackendError:
        if isinstance(exc, httpx.TimeoutException):
            return BackendError(
                f"Backend {self.name!r} timed out ({what}).",
                status=504,
                code="upstream_timeout",
                type=TIMEOUT,
                unhealthy=isinstance(exc, httpx.ConnectTimeout),
            )
        return BackendError(
            f"Backend {self.name!r} is unreachable ({type(exc).__name__}).",
            code="upstream_unreachable",
            unhealthy=isinstance(
                exc, httpx.ConnectError | httpx.RemoteProtocolError | httpx.ReadError
            ),
        )

    async def _status_error(self, resp: httpx.Response) -> BackendError:
        raw = b""
        try:
            async for part in resp.aiter_bytes():
                raw += part
                if len(raw) > _MAX_ERROR_BODY:
                    break
            body = orjson.loads(raw) if raw else None
        except (httpx.HTTPError, ValueError):
            body = None
        status = resp.status_code
        upstream_msg = body["error"].get("message") if _is_openai_error(body) else None
        if status >= 500:
            # The client gets 502 (the gateway's upstream failed); another backend may do.
            return BackendError(
                f"Backend {self.name!r} answered HTTP {status}"
                + (f": {upstream_msg}" if upstream_msg else "."),
                status=502,
                retryable=True,
                unhealthy=status in (502, 503),
            )
        # 4xx: the client's problem (relayed as it was), except 404 (this backend lacks
        # the model), 408 and 429, which another backend may not have.
        message = str(upstream_msg or f"Backend {self.name!r} answered HTTP {status}.")
        return BackendError(
            message,
            status=status,
            retryable=status in (404, 408, 429),
            body=body if _is_openai_error(body) else error_body(message),
        )

    async def open_stream(
        self, endpoint: Endpoint, body: dict[str, Any], ctx: RequestContext
    ) -> ChunkStream:
        t = self._timeouts
        request = self.client.build_request(
            "POST",
            self.url_for(endpoint),
            content=orjson.dumps(body),
            headers={
                **self._request_headers(ctx),
                "Accept": "text/event-stream",
                "Accept-Encoding": "identity",  # relayed as read: no decoding on the way
            },
            # No read timeout: the caller bounds the wait for the response headers
            # (gateway.dispatch.open_attempt) and the relay the first-chunk and
            # between-chunk gaps; a per-read timer here would cost every chunk.
            timeout=httpx.Timeout(
                connect=t.connect_s, read=None, write=t.connect_s, pool=t.connect_s
            ),
        )
        try:
            resp = await self.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise self._transport_error(exc, "before the response") from exc
        try:
            if resp.status_code != 200:
                raise await self._status_error(resp)
            ctype = resp.headers.get("content-type", "")
            if "text/event-stream" not in ctype:
                raise BackendError(
                    f"Backend {self.name!r} answered a stream with {ctype or 'no content type'!r}.",
                    code="upstream_bad_response",
                )
        except BaseException:
            await resp.aclose()
            raise
        return HttpChunkStream(self.name, resp)

    async def complete(
        self, endpoint: Endpoint, body: dict[str, Any], ctx: RequestContext
    ) -> dict[str, Any]:
        t = self._timeouts
        try:
            with anyio.fail_after(t.request_s):
                async with self.client.stream(
                    "POST",
                    self.url_for(endpoint),
                    content=orjson.dumps(body),
                    headers=self._request_headers(ctx),
                    timeout=httpx.Timeout(
                        connect=t.connect_s, read=t.request_s, write=t.connect_s, pool=t.connect_s
                    ),
                ) as resp:
                    if resp.status_code != 200:
                        raise await self._status_error(resp)
                    raw = await resp.aread()
        except TimeoutError as exc:
            raise BackendError(
                f"Backend {self.name!r} did not answer within {t.request_s} s.",
                status=504,
                code="upstream_timeout",
                type=TIMEOUT,
            ) from exc
        except httpx.HTTPError as exc:
            raise self._transport_error(exc, "non-streaming request") from exc
        try:
            result = orjson.loads(raw)
        except ValueError:
            result = None
        if not isinstance(result, dict) or _is_openai_error(result):
            raise BackendError(
                f"Backend {self.name!r} sent a response that is not an OpenAI object.",
                code="upstream_bad_response",
            )
        return result


class HttpChunkStream(ChunkStream):
    """Server-sent events from an upstream response, parsed into chunk dicts.

    Each :meth:`next_batch` is one read of the body (:func:`gateway.upstream.body_reader`:
    everything the connection has buffered), split into events as bytes (SSE is UTF-8 by
    definition) and parsed by orjson (the json module's parsing was a third of the
    gateway's CPU at saturation). A failure after some good events of a read is raised
    at the next call, after those events are relayed. After ``data:
    [DONE]``, :meth:`aclose` reads the end of the body (normally just the
    chunked-encoding terminator, already received) so that the connection goes back to
    the pool; closing it half-read would make every stream open a new TCP connection.
    """

    def __init__(self, backend: str, resp: httpx.Response) -> None:
        self._backend = backend
        self._resp = resp
        self._read = body_reader(resp)
        self._buf = b""  # an incomplete line
        self._data: list[bytes] = []  # the data lines of the event being read
        self._events: deque[bytes] = deque()  # complete event payloads, not yet returned
        self._error: BackendError | None = None  # raised at the next call
        self._eof = False
        self._done = False
        self._clean_end = False  # [DONE] arrived
        self._closed = False

    async def next_batch(self) -> list[Chunk]:
        if self._error is not None:
            raise self._error
        while not self._events:
            if self._done:
                return []
            if self._eof:
                self._done = True
                raise BackendError(
                    f"Backend {self._backend!r} closed the stream before [DONE].",
                    code="upstream_truncated",
                )
            try:
                part = await self._read()
            except httpx.HTTPError as exc:
                self._done = True
                raise BackendError(
                    f"Backend {self._backend!r} failed mid-stream ({type(exc).__name__}).",
                    code="upstream_truncated",
                    unhealthy=not isinstance(exc, httpx.TimeoutException),
                ) from exc
            if part:
                self._feed(part)
            else:
                self._eof = True
                self._feed(b"\n\n")  # a last event without its blank line
        batch: list[Chunk] = []
        events = self._events
        while events:
            payload = events.popleft()
            if payload.strip() == b"[DONE]":
                self._done = self._clean_end = True
                events.clear()
                break
            try:
                chunk = self._event(payload)
            except BackendError as exc:
                self._done = True
                events.clear()
                if not batch:
                    raise
                self._error = exc
                break
            # One data line per event: relayed as it came (a payload split over several
            # data lines is re-encoded instead).
            batch.append((chunk, None if b"\n" in payload else b"data: " + payload + b"\n\n"))
        return batch

    def _feed(self, part: bytes) -> None:
        """Add ``part`` of the body; complete events go to ``_events``.

        The usual event, one ``data: {...}`` line and a blank line, is cut out by one
        split of the whole read; anything else (other fields, comments, several data
        lines, CR line ends) goes through the line parser.
        """
        buf = self._buf + part
        if b"\r" in buf or self._data:
            self._buf = self._feed_lines(buf)
            return
        *blocks, rest = buf.split(b"\n\n")
        for block in blocks:
            if block.startswith(b"data: ") and b"\n" not in block:
                self._events.append(block[6:])
            else:
                self._feed_lines(block + b"\n\n")
        self._buf = rest

    def _feed_lines(self, buf: bytes) -> bytes:
        """Split ``buf`` into lines (LF, CRLF or CR) and events; return the incomplete end."""
        if b"\r" in buf:
            held = b"\r" if buf.endswith(b"\r") else b""  # may be the first half of CRLF
            if held:
                buf = buf[:-1]
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            *lines, rest = buf.split(b"\n")
            rest += held
        else:
            *lines, rest = buf.split(b"\n")
        data = self._data
        for line in lines:
            if not line:
                if data:
                    self._events.append(b"\n".join(data))
                    data.clear()
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
            elif line == b"data":
                data.append(b"")
            # comments (":"), "event:", "id:", "retry:" carry nothing for OpenAI streams
        return rest

    def _event(self, payload: bytes) -> dict[str, Any]:
        try:
            chunk = orjson.loads(payload)
        except ValueError:
            raise BackendError(
                f"Backend {self._backend!r} sent malformed data in its stream.",
                code="upstream_bad_response",
            ) from None
        if not isinstance(chunk, dict):
            raise BackendError(
                f"Backend {self._backend!r} sent a stream event that is not an object.",
                code="upstream_bad_response",
            )
        if _is_openai_error(chunk):
            err = chunk["error"]
            raise BackendError(
                str(err.get("message") or "the backend reported an error"),
                retryable=False,
                body=chunk,
            )
        return chunk

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._clean_end:  # read the rest of the body, so the connection can be reused
            with contextlib.suppress(Exception), anyio.move_on_after(_DRAIN_S):
                left = _MAX_ERROR_BODY
                while left >= 0 and (part := await self._read()):
                    left -= len(part)
        await self._resp.aclose()


# ---------------------------------------------------------------------------------
# backend kinds (configuration -> Backend)

BackendFactory = Callable[[BackendConfig, GatewayConfig], Backend]
_KINDS: dict[str, BackendFactory] = {"http": HttpBackend.from_config}


def register_backend_kind(kind: str, factory: BackendFactory) -> None:
    """Let ``backends[].kind: <kind>`` in a configuration build ``factory(cfg, config)``."""
    _KINDS[kind] = factory


def registered_kinds() -> set[str]:
    return set(_KINDS)


config_mod.set_backend_kind_provider(registered_kinds)


def build_backends(config: GatewayConfig) -> list[Backend]:
    return [_KINDS[b.kind](b, config) for b in config.backends]


# ---------------------------------------------------------------------------------
# routing


@dataclass(eq=False)
class BackendState:
    backend: Backend
    index: int
    throughput_tps: float
    healthy: bool = True
    in_flight: int = 0
    outstanding_tokens: int = 0
    last_error: str | None = None
    checked_at: float | None = None

    @property
    def name(self) -> str:
        return self.backend.name

    def waiting_time(self) -> float:
        return request_waiting_time(self.outstanding_tokens, self.throughput_tps)


@dataclass(eq=False)
class Lease:
    """A request's share of a backend's outstanding work; released exactly once."""

    state: BackendState
    remaining: int
    released: bool = field(default=False)

    def tokens(self, n: int) -> None:
        """``n`` more output tokens arrived: that much less work is outstanding."""
        if n <= 0 or self.released:
            return
        dec = min(n, self.remaining)
        self.remaining -= dec
        self.state.outstanding_tokens -= dec

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.state.in_flight -= 1
        self.state.outstanding_tokens -= self.remaining
        self.remaining = 0


class Router:
    """Health, load accounting and backend choice."""

    def __init__(self, backends: Sequence[Backend], config: GatewayConfig) -> None:
        default_tps = config.routing.throughput_tps
        self.states = [
            BackendState(b, i, b.throughput_tps or default_tps) for i, b in enumerate(backends)
        ]
        self._rr = 0
        self._health = config.health

    def model_cards(self) -> list[dict[str, Any]]:
        """``/v1/models`` entries: each named model once, described by its first backend."""
        seen: dict[str, dict[str, Any]] = {}
        for s in self.states:
            for m in s.backend.models:
                if m != "*" and m not in seen:
                    seen[m] = {**s.backend.model_card(m), "id": m}
        return list(seen.values())

    def knows_model(self, model: str) -> bool:
        return any(s.backend.serves(model) for s in self.states)

    def any_healthy(self) -> bool:
        return any(s.healthy for s in self.states)

    def pick(
        self, model: str, exclude: Iterable[str] = (), prefer: str | None = None
    ) -> BackendState | None:
        """The backend for the next attempt, or None when every candidate was tried.

        Healthy backends first, by least waiting time, then fewest in flight, then round
        robin; backends marked unhealthy are tried only when no healthy one is left.
        ``prefer`` (the backend admission reserved a slot on) goes first when untried.
        """
        excluded = set(exclude)
        cands = [s for s in self.states if s.name not in excluded and s.backend.serves(model)]
        if not cands:
            return None
        pool = [s for s in cands if s.healthy] or cands
        n = len(self.states)
        rr = self._rr
        best = next((s for s in cands if s.name == prefer), None) or min(
            pool, key=lambda s: (s.waiting_time(), s.in_flight, (s.index - rr) % n)
        )
        self._rr = (best.index + 1) % n
        return best

    def acquire(self, state: BackendState, expected_tokens: int) -> Lease:
        state.in_flight += 1
        state.outstanding_tokens += expected_tokens
        return Lease(state, expected_tokens)

    def report_failure(self, state: BackendState, exc: BackendError) -> None:
        state.last_error = exc.message
        if exc.unhealthy and state.healthy:
            state.healthy = False
            log.warning("backend %s marked unhealthy: %s", state.name, exc.message)

    async def check(self, state: BackendState) -> bool:
        try:
            with anyio.fail_after(self._health.timeout_s + 1.0):
                ok = bool(await state.backend.check_health())
        except Exception as exc:  # a broken health check is an unhealthy backend
            ok = False
            state.last_error = f"health check failed: {exc!r}"
        if ok != state.healthy:
            log.log(
                logging.INFO if ok else logging.WARNING,
                "backend %s is %s",
                state.name,
                "healthy" if ok else "unhealthy",
            )
        state.healthy = ok
        state.checked_at = time.monotonic()
        return ok

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(s) for s in self.states))

    async def health_loop(self) -> None:
        while True:
            await asyncio.sleep(self._health.interval_s)
            await self.check_all()
