"""Backends reached over HTTP: an OpenAI-compatible server (vLLM, or any other).

One shared ``httpx.AsyncClient`` carries every request (:func:`build_http_client`: a
connection pool per backend origin). With ``vllm_metrics`` the backend also reads vLLM's
``/metrics`` for its capacity: no admission while the KV cache or the waiting queue is
past the configured bounds.
"""

from __future__ import annotations

import re
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import anyio
import httpx
import orjson

from gateway.backends.base import (
    ENDPOINT_PATHS,
    Backend,
    BackendError,
    BackendRuntime,
    ChunkStream,
)
from gateway.backends.sse import MAX_ERROR_BODY, HttpChunkStream, is_openai_error
from gateway.backends.upstream import UpstreamTransport
from gateway.config.schema import BackendConfig, GatewayConfig, HealthConfig, TimeoutsConfig
from gateway.context import Endpoint, RequestContext
from gateway.errors import TIMEOUT, error_body

DEFAULT_MAX_CONNECTIONS = 100  # to an origin no backend names (none, normally)


def vllm_gauge(text: str, *names: str) -> float | None:
    """The sum of the series of the first metric in ``names`` found in Prometheus text."""
    for name in names:
        values = [
            float(m.group(1))
            for m in re.finditer(
                rf"^{re.escape(name)}(?:\{{[^}}]*\}})?\s+([-+0-9.eEnaNifI]+)", text, re.M
            )
        ]
        if values:
            return sum(values)
    return None


def _origin(url: str) -> str:
    u = httpx.URL(url)
    return f"{u.scheme}://{u.host}" + (f":{u.port}" if u.port else "")


def build_http_client(config: GatewayConfig) -> httpx.AsyncClient:
    """The one shared client: an aiohttp connection pool per backend origin.

    (gateway/backends/upstream.py says why aiohttp carries the bytes.) Two backends behind one
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
        # A backend's cookies are never kept: one tenant's request must not carry state
        # a backend set on another's.
        cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
    )


def upstream_transport(max_connections: int) -> UpstreamTransport:
    """The transport of one backend origin, as the gateway configures it."""
    # Idle connections expire before uvicorn's default 5 s keep-alive (vLLM's server)
    # closes them: reusing one the server already closed fails the request.
    return UpstreamTransport(max_connections=max_connections, keepalive_expiry=4.0)


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
        self._stream_headers = {
            **self._headers,
            "Accept": "text/event-stream",
            "Accept-Encoding": "identity",  # relayed as read: no decoding on the way
        }
        self._stream_header_items: list[tuple[bytes, bytes]] = []  # with the client's, at start
        # A stream has no read timeout: the caller bounds the wait for the response
        # headers (Failover.open_stream) and the relay the first-chunk and
        # between-chunk gaps; a per-read timer here would cost every chunk.
        self._stream_timeout = httpx.Timeout(
            connect=timeouts.connect_s, read=None, write=timeouts.connect_s, pool=timeouts.connect_s
        ).as_dict()
        # Parsed once: httpx's URL parsing was a tenth of the gateway's CPU per request.
        self._urls = {e: httpx.URL(f"{cfg.url}/{path}") for e, path in ENDPOINT_PATHS.items()}
        self._client: httpx.AsyncClient | None = None
        self._metrics_url = httpx.URL(cfg.url).copy_with(path="/metrics")
        self._capacity = (cfg.max_kv_usage, cfg.max_waiting) if cfg.vllm_metrics else None

    @classmethod
    def from_config(cls, cfg: BackendConfig, config: GatewayConfig) -> HttpBackend:
        return cls(cfg, config.timeouts, config.health)

    async def start(self, runtime: BackendRuntime) -> None:
        self._client = runtime.http
        # A stream's headers merged with the client's defaults once, as the client's
        # build_request would merge them on every request.
        headers = httpx.Headers(runtime.http.headers)
        headers.update(self._stream_headers)
        self._stream_header_items = headers.raw

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError(f"backend {self.name!r} used before the gateway started")
        return self._client

    def url_for(self, endpoint: Endpoint) -> httpx.URL:
        return self._urls[endpoint]

    def _request_headers(self, ctx: RequestContext) -> dict[str, str]:
        return {**self._headers, "X-Request-Id": ctx.request_id}

    def _stream_request(
        self, endpoint: Endpoint, body: dict[str, Any], ctx: RequestContext
    ) -> httpx.Request:
        """The request opening a stream: what ``client.build_request`` would make (the
        client keeps no cookies), from the headers merged at start-up (merged on every
        request, they cost about 45 µs)."""
        return httpx.Request(
            "POST",
            self.url_for(endpoint),
            content=orjson.dumps(body),
            headers=[*self._stream_header_items, (b"X-Request-Id", ctx.request_id.encode())],
            extensions={"timeout": self._stream_timeout},
        )

    async def check_health(self) -> bool:
        auth = {k: v for k, v in self._headers.items() if k == "Authorization"}
        try:
            resp = await self.client.get(
                self.health_url, headers=auth, timeout=self._health.timeout_s
            )
        except httpx.HTTPError:
            return False
        return 200 <= resp.status_code < 300

    @property
    def probes_capacity(self) -> bool:
        return self._capacity is not None

    async def saturated(self) -> bool:
        """vLLM's ``/metrics`` says its KV cache or waiting queue is past the bounds.

        No report (unreachable, not vLLM) is not saturation: the health checks and
        ``max_concurrent`` still apply.
        """
        if self._capacity is None:
            return False
        max_kv, max_waiting = self._capacity
        try:
            resp = await self.client.get(self._metrics_url, timeout=self._health.timeout_s)
            resp.raise_for_status()
        except httpx.HTTPError:
            return False
        text = resp.text
        kv = vllm_gauge(text, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
        waiting = vllm_gauge(text, "vllm:num_requests_waiting")
        return (kv is not None and kv >= max_kv) or (
            max_waiting is not None and waiting is not None and waiting > max_waiting
        )

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
                if len(raw) > MAX_ERROR_BODY:
                    break
            body = orjson.loads(raw) if raw else None
        except (httpx.HTTPError, ValueError):
            body = None
        status = resp.status_code
        upstream_msg = (
            body["error"].get("message")
            if isinstance(body, dict) and is_openai_error(body)
            else None
        )
        if status >= 500:
            # The client gets 502 (the gateway's upstream failed); another backend may do.
            return BackendError(
                f"Backend {self.name!r} answered HTTP {status}"
                + (f": {upstream_msg}" if upstream_msg else "."),
                status=502,
                retryable=True,
                unhealthy=status in (502, 503),
            )
        if status in (401, 403):
            # The backend refused the gateway's own credentials (backends[].api_key): the
            # client's key was accepted, so relaying this would blame the client.
            return BackendError(
                f"Backend {self.name!r} refused the gateway's credentials (HTTP {status}"
                + (f": {upstream_msg}" if upstream_msg else "")
                + f"). The gateway's configuration must give backend {self.name!r} the key "
                "it accepts (backends[].api_key); the client's API key is not the cause.",
                status=502,
                retryable=True,
                code="upstream_auth_failed",
            )
        # 4xx: the client's problem (relayed as it was), except 404 (this backend lacks
        # the model), 408 and 429, which another backend may not have.
        message = str(upstream_msg or f"Backend {self.name!r} answered HTTP {status}.")
        return BackendError(
            message,
            status=status,
            retryable=status in (404, 408, 429),
            body=body if is_openai_error(body) else error_body(message),
        )

    async def open_stream(
        self, endpoint: Endpoint, body: dict[str, Any], ctx: RequestContext
    ) -> ChunkStream:
        request = self._stream_request(endpoint, body, ctx)
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
        if not isinstance(result, dict) or is_openai_error(result):
            raise BackendError(
                f"Backend {self.name!r} sent a response that is not an OpenAI object.",
                code="upstream_bad_response",
            )
        return result
