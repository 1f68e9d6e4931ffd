"""Gateway configuration: the pydantic models (:mod:`gateway.config.loader` reads a file).

The file is validated once at start-up; every error names the key that is wrong
(``tenants[1].default_tier: ...``). API keys are kept only as SHA-256 digests: a
tenant's ``api_keys`` entries may be the plain key (``key``, hashed at load and then
forgotten) or its digest (``key_sha256``, what production files should hold; make
one with ``tokenpace hash-key`` or ``printf %s KEY | sha256sum``).

Tier defaults are the contract's (docs/protocol.md, "QoE tiers"); an operator's
``tiers`` table is merged over them, so a file may retune one tier or add new ones.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

CONFIG_ENV = "TOKENPACE_CONFIG"
DEMO_MODEL = "tokenpace-sim"
CUSTOM_TIER = "custom"
BACKEND_KINDS = ("embedded", "http")  # gateway.backends.kinds builds each
OVERLOAD_AFTER_TTFTS = 10.0
"""A request that waits this many TTFTs for an engine is overloaded (unless its tier says
otherwise): the least wait after which the engines' reader guard admits a waiting request
as overdue (``qos.policy.reader.ReaderGuard``'s ``overdue_after_ttfts``)."""
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")


class ConfigError(ValueError):
    """The configuration is invalid; ``problems`` lists ``key: reason`` lines, every one
    of them (not only the first), each prefixed with ``source`` (the file) when known."""

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        self.problems = problems
        self.source = source
        count = f"{len(problems)} problems" if len(problems) != 1 else "1 problem"
        super().__init__(f"invalid configuration ({count}):\n  " + "\n  ".join(self.lines()))

    def lines(self) -> list[str]:
        """``source: key: reason`` (``key: reason`` without a source), one per problem."""
        return [f"{self.source}: {p}" if self.source else p for p in self.problems]


def hash_key(key: str) -> str:
    """SHA-256 hex digest of an API key (how keys are stored and looked up)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _sha256_hex(v: str | None) -> str | None:
    if v is not None:
        v = v.strip().lower()
        if not _HEX64.match(v):
            raise ValueError("must be 64 hexadecimal characters (a SHA-256 digest)")
    return v


Sha256Hex = Annotated[str | None, AfterValidator(_sha256_hex)]


def _digest(plain: str | None, digest: str | None, names: tuple[str, str]) -> str | None:
    """The digest of a secret given as plain text or as its digest (at most one)."""
    if plain is not None and digest is not None:
        raise ValueError(f"give at most one of '{names[0]}' or '{names[1]}'")
    return hash_key(plain) if plain is not None else digest


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class TierSpec(_Strict):
    """One QoE tier: the expected token delivery timeline."""

    ttft: float = Field(ge=0, description="expected time to first token, seconds")
    tds: float = Field(gt=0, description="expected token delivery speed, tokens per second")
    priority: int = Field(
        0, description="vLLM priority for engines running its priority policy (lower is sooner)"
    )
    overload_after_s: float | None = Field(
        None,
        ge=0,
        description="a request still waiting for an engine this long after it arrived is "
        f"answered 'overloaded'; None = {OVERLOAD_AFTER_TTFTS:g} x ttft",
    )


DEFAULT_TIERS: dict[str, TierSpec] = {
    "chat": TierSpec(ttft=1.0, tds=4.8, priority=1),
    "voice": TierSpec(ttft=1.0, tds=3.3, priority=1),
    "fast": TierSpec(ttft=0.5, tds=25.0, priority=0),
    "batch": TierSpec(ttft=60.0, tds=50.0, priority=2),
}


class CustomTierLimits(_Strict):
    """A plan's accepted range of explicit ``tokenpace.ttft`` / ``tokenpace.tds`` values."""

    ttft_min: float = Field(0.0, ge=0)
    ttft_max: float = Field(600.0, gt=0)
    tds_min: float = Field(0.1, gt=0)
    tds_max: float = Field(1000.0, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> CustomTierLimits:
        if self.ttft_min > self.ttft_max:
            raise ValueError("ttft_min must be <= ttft_max")
        if self.tds_min > self.tds_max:
            raise ValueError("tds_min must be <= tds_max")
        return self


class ApiKey(_Strict):
    """Exactly one of ``key`` (plain, hashed at load) or ``key_sha256`` (hex digest)."""

    key: str | None = Field(None, min_length=8, repr=False)
    key_sha256: Sha256Hex = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ApiKey:
        if (self.key is None) == (self.key_sha256 is None):
            raise ValueError("give exactly one of 'key' or 'key_sha256'")
        if self.key is not None:  # hash and forget the plain key
            self.key_sha256 = hash_key(self.key)
            self.key = None
        return self

    @property
    def digest(self) -> str:
        assert self.key_sha256 is not None
        return self.key_sha256


class TenantConfig(_Strict):
    """A tenant: who may call, with what weight, in which tiers."""

    name: str
    api_keys: list[ApiKey] = Field(min_length=1)
    weight: float = Field(1.0, gt=0, description="fair-share weight (VTC)")
    tiers: list[str] | None = Field(None, description="allowed tiers; omitted = every tier")
    default_tier: str = "chat"
    allow_custom: bool = Field(False, description="may send explicit tokenpace.ttft / tds")
    custom_tier_limits: CustomTierLimits | None = Field(
        None,
        description="range of explicit ttft/tds for this plan; omitted = the range its tiers "
        "span (TTFT from its shortest tier's, TDS up to its fastest tier's)",
    )
    requests_per_minute: int | None = Field(
        None, ge=1, description="requests admitted per sliding minute, all replicas together"
    )
    tokens_per_minute: int | None = Field(
        None, ge=1, description="prompt + output tokens per sliding minute, all replicas"
    )
    token_budget: int | None = Field(
        None, ge=1, description="prompt + output tokens per budget period (a quota)"
    )
    budget_period_s: int = Field(86400, ge=60, description="length of a token_budget period")
    max_queued: int = Field(
        64, ge=0, description="requests waiting in the gateway's queue; past it 429; 0 = none"
    )
    max_concurrent: int | None = Field(
        None,
        ge=1,
        description="requests of this plan holding slots of a model's backends at once, all "
        "replicas together (more wait in the queue); omitted = all but one of the slots "
        "where the backends are capped and other tenants are configured, else no cap",
    )
    max_body_bytes: int | None = Field(
        None, ge=1024, description="this plan's request body limit (413); omitted = limits'"
    )
    max_messages: int | None = Field(
        None, ge=1, description="this plan's messages per chat request (400); omitted = limits'"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must be 1-64 characters: letters, digits, '.', '_', ':', '-'")
        return v

    @field_validator("api_keys", mode="before")
    @classmethod
    def _plain_strings(cls, v: Any) -> Any:
        # A bare string in the list is shorthand for {key: "..."}.
        if isinstance(v, list):
            return [{"key": item} if isinstance(item, str) else item for item in v]
        return v


class BackendConfig(_Strict):
    """An upstream that serves OpenAI-compatible requests."""

    name: str
    kind: str = Field("http", description="'http', or 'embedded' (the simulated engine)")
    url: str | None = Field(None, description="base URL including /v1, e.g. http://vllm:8000/v1")
    models: list[str] = Field(min_length=1, description="model names served; '*' = any")
    tokenpace: bool = Field(False, description="runs the tokenpace scheduler: tag with vllm_xargs")
    supports_priority: bool = Field(False, description="accepts vLLM's 'priority' field")
    api_key: str | None = Field(None, repr=False, description="sent upstream as Bearer")
    api_key_env: str | None = Field(None, description="environment variable holding api_key")
    health_path: str = Field(
        "models", description="GET target for health checks, relative to url or absolute ('/x')"
    )
    max_concurrent: int | None = Field(
        None, ge=1, description="requests in flight on it, all replicas together; None = no cap"
    )
    vllm_metrics: bool = Field(
        False, description="read the backend's vLLM /metrics (KV-cache usage, waiting requests)"
    )
    max_kv_usage: float = Field(0.95, gt=0, le=1, description="no admission at or above this")
    max_waiting: int | None = Field(
        None, ge=0, description="no admission while vLLM has more requests waiting than this"
    )
    max_connections: int = Field(256, ge=1, description="upstream connections to its origin")
    throughput_tps: float | None = Field(
        None, gt=0, description="token throughput for the waiting-time estimate"
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="settings for non-http kinds (passed through)"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must be 1-64 characters: letters, digits, '.', '_', ':', '-'")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not re.match(r"^https?://[^/\s]+", v):
            raise ValueError("must be an http:// or https:// URL")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _kind_needs(self) -> BackendConfig:
        if self.kind == "http" and not self.url:
            raise ValueError("an http backend needs 'url'")
        return self

    def resolved_api_key(self) -> str | None:
        if self.api_key is not None:
            return self.api_key
        if self.api_key_env:
            return os.environ.get(self.api_key_env)
        return None


class TimeoutsConfig(_Strict):
    connect_s: float = Field(5.0, gt=0, description="TCP/TLS connect to a backend")
    first_byte_s: float = Field(
        120.0, gt=0, description="a stream's first chunk (or a backend's response headers)"
    )
    idle_s: float = Field(60.0, gt=0, description="longest gap between two chunks of a stream")
    request_s: float = Field(600.0, gt=0, description="a whole non-streaming request")
    ping_interval_s: float = Field(
        5.0, ge=0, description="SSE ': ping' comment while waiting for a chunk; 0 = off"
    )


class HealthConfig(_Strict):
    interval_s: float = Field(5.0, gt=0)
    timeout_s: float = Field(2.0, gt=0)


class LimitsConfig(_Strict):
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="larger bodies get 413")
    max_header_bytes: int = Field(
        32 * 1024, ge=1024, description="request line and headers together; larger get 431"
    )
    max_tokens: int = Field(65536, ge=1, description="cap on max_tokens/max_completion_tokens")
    max_n: int = Field(16, ge=1, description="cap on n")
    max_messages: int = Field(
        2048, ge=1, description="messages in a chat request; more get 400 (a plan may differ)"
    )
    max_parts: int = Field(
        8192, ge=1, description="content parts, tool calls and tools of a chat request together"
    )


class RoutingConfig(_Strict):
    """How a backend is chosen (docs/architecture/cache-aware-routing.md)."""

    policy: Literal["cache_aware", "least_waiting"] = Field(
        "cache_aware",
        description="'cache_aware': the first token's QoE with each backend's prefix cache; "
        "'least_waiting': least waiting time, then fewest in flight, then round robin",
    )
    expected_output_tokens: int = Field(
        256, ge=1, description="output length assumed for a request without max_tokens"
    )
    throughput_tps: float = Field(
        1000.0, gt=0, description="default backend token throughput (QLM's Θ)"
    )
    prefill_tps: float = Field(
        8000.0, gt=0, description="cache_aware: prompt tokens per second a backend prefills"
    )
    prefix_block_chars: int = Field(
        256, ge=16, le=65536, description="cache_aware: characters of prompt text per indexed block"
    )
    prefix_index_blocks: int = Field(
        65536, ge=1, description="cache_aware: blocks remembered per backend (LRU)"
    )
    load_factor: float = Field(
        1.25,
        ge=1.0,
        description="cache_aware: no backend takes more than this times the mean in flight",
    )

    @model_validator(mode="after")
    def _cache_aware_keys(self) -> RoutingConfig:
        if self.policy != "cache_aware":
            unused = sorted(CACHE_AWARE_KEYS & self.model_fields_set)
            if unused:
                raise ValueError(
                    f"{', '.join(unused)}: only read by policy 'cache_aware' "
                    f"(policy is '{self.policy}'); remove them or set policy: cache_aware"
                )
        return self


CACHE_AWARE_KEYS = frozenset(
    {"prefill_tps", "prefix_block_chars", "prefix_index_blocks", "load_factor"}
)


class LoggingConfig(_Strict):
    json_logs: bool = Field(False, alias="json")
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class StoreConfig(_Strict):
    """Where the state shared by gateway replicas lives (docs/architecture/gateway.md)."""

    redis_url: str | None = Field(
        None, description="redis://host:port/db; None = in-memory (one replica only)"
    )
    key_prefix: str = Field("tokenpace", min_length=1, description="prefix of every Redis key")
    fail_mode: Literal["open", "closed"] = Field(
        "open", description="Redis unreachable: 'open' serves on local state, 'closed' 503s"
    )
    timeout_s: float = Field(
        0.5,
        gt=0,
        description="one Redis command, connect included; also the longest wait for a "
        "free connection (then 503 store_busy)",
    )
    max_connections: int = Field(
        256, ge=1, description="Redis connections per gateway process; more calls wait"
    )
    reconnect_interval_s: float = Field(1.0, gt=0, description="probe period while Redis is down")
    key_cache_s: float = Field(5.0, ge=0, description="API key lookups cached this long")
    request_ttl_s: int = Field(
        7 * 86400, ge=60, description="request ids remembered this long (telemetry ownership)"
    )

    @field_validator("redis_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^(redis|rediss|unix)://", v):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return v


class AdmissionConfig(_Strict):
    """The gateway's queue in front of the backends (weighted VTC order)."""

    poll_interval_s: float = Field(
        0.05, gt=0, description="queued requests re-check the shared queue at least this often"
    )
    lease_s: float = Field(
        10.0, gt=0, description="a replica's hold on a slot or queue place lapses unless renewed"
    )
    max_wait_s: float = Field(120.0, gt=0, description="longest wait in the queue, then 503")
    overload: Literal["queue", "reject"] = Field(
        "queue",
        description="past a tier's overload_after_s (docs/protocol.md, 'Overload'): 'queue' "
        "answers a waiting stream 200 at once with queue notices; 'reject' answers 503 as "
        "soon as the estimated wait is past the bound",
    )
    metrics_interval_s: float = Field(1.0, gt=0, description="vLLM /metrics polling period")
    charge_interval_s: float = Field(
        0.05, gt=0, description="streamed output tokens are charged in batches this often"
    )


class TelemetryConfig(_Strict):
    """``POST /v1/tokenpace/telemetry`` and ``GET /v1/tokenpace/qoe``."""

    max_body_bytes: int = Field(256 * 1024, ge=1024, description="larger reports get 413")
    anonymous_bodies_max_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="bodies of reports without a credential (a beacon's) read at once by a "
        "gateway process, all connections together; past it 503 server_busy",
    )
    max_points: int = Field(20000, ge=1, description="entries in arrivals or displayed")
    requests_per_minute: int = Field(600, ge=1, description="reports per tenant per minute")
    retention_s: int = Field(7 * 86400, ge=60, description="records older than this are trimmed")
    max_records: int = Field(1_000_000, ge=100, description="records kept at most")
    buffer_max: int = Field(10000, ge=0, description="records held while Redis is down")
    window_s: int = Field(3600, ge=1, description="default window of GET /v1/tokenpace/qoe")
    token_ttl_s: int = Field(
        900, ge=10, le=86400, description="a telemetry token is valid this long after issue"
    )
    token_secret: str | None = Field(
        None,
        min_length=32,
        repr=False,
        description="HMAC key of telemetry tokens, the same on every replica; "
        "omitted = one created once in the shared store",
    )


class AdminConfig(_Strict):
    """The operator's key for ``/v1/tokenpace/admin/*`` and every tenant's QoE."""

    key: str | None = Field(None, repr=False, description="plain key (hashed at load)")
    key_sha256: Sha256Hex = Field(None, description="SHA-256 hex digest of the admin key")

    @model_validator(mode="after")
    def _hash(self) -> AdminConfig:
        self.key_sha256 = _digest(self.key, self.key_sha256, ("key", "key_sha256"))
        self.key = None
        return self


class CorsConfig(_Strict):
    allow_origins: list[str] = Field(default_factory=list)


class ServerConfig(_Strict):
    """The HTTP server: where it listens and what a client connection may cost."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    header_timeout_s: float = Field(
        10.0, gt=0, description="from connect (or a request's first byte) to its last header"
    )
    body_timeout_s: float = Field(
        30.0, gt=0, description="from the last header to the last byte of the body"
    )
    write_timeout_s: float = Field(
        30.0,
        gt=0,
        description="a response the client stops reading (the connection's send buffer "
        "full) is cut after this long without the client catching up; its stream ends and "
        "gives back its slot",
    )
    max_connections: int = Field(
        4096, ge=1, description="open client connections; past it a new one gets 503 and closes"
    )
    docs: bool = Field(
        True, description="serve /openapi.json and /docs (Swagger UI, from the gateway itself)"
    )
    drain_s: float = Field(
        20.0,
        ge=0,
        description="on SIGTERM, open requests get this long to finish, then end with "
        "server_shutting_down (20 s: Kubernetes' default 30 s grace with a 5 s preStop)",
    )


class MetricsConfig(_Strict):
    """Who may read ``/metrics`` (tenant names and per-tenant QoE are in it).

    By default it is served on the main port to anyone, as the default listen address is
    loopback; a gateway reachable by others should set ``port`` (a listener of its own,
    e.g. on an internal interface) or a ``token`` (``Authorization: Bearer TOKEN``).
    """

    port: int | None = Field(
        None, ge=1, le=65535, description="serve /metrics only on this port (same host)"
    )
    token: str | None = Field(None, repr=False, description="plain token (hashed at load)")
    token_sha256: Sha256Hex = Field(None, description="SHA-256 hex digest of the token")

    @model_validator(mode="after")
    def _hash(self) -> MetricsConfig:
        self.token_sha256 = _digest(self.token, self.token_sha256, ("token", "token_sha256"))
        self.token = None
        return self


class GatewayConfig(_Strict):
    """The whole configuration file."""

    server: ServerConfig = Field(default_factory=ServerConfig)
    tiers: dict[str, TierSpec] = Field(default_factory=dict)
    custom_tier_limits: None = Field(
        None, description="removed: the limits are per plan, tenants[].custom_tier_limits"
    )
    tenants: list[TenantConfig] = Field(min_length=1)
    backends: list[BackendConfig] = Field(default_factory=list)
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    cors: CorsConfig = Field(default_factory=CorsConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    admin: AdminConfig = Field(default_factory=AdminConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    recent_requests: int = Field(
        100_000, ge=0, description="request ids remembered in memory (in-memory store, mirror)"
    )

    @field_validator("tiers")
    @classmethod
    def _merge_default_tiers(cls, v: dict[str, TierSpec]) -> dict[str, TierSpec]:
        return merged_tiers(v)

    @field_validator("custom_tier_limits", mode="before")
    @classmethod
    def _custom_limits_moved(cls, v: Any) -> None:
        raise ValueError(
            "no longer a global setting: the range of explicit ttft/tds is per plan; "
            "move it to tenants[].custom_tier_limits of each tenant with allow_custom "
            "(without one, a plan's range is the one its tiers span)"
        )

    @model_validator(mode="after")
    def _cross_checks(self) -> GatewayConfig:
        if not self.tiers:
            self.tiers = dict(DEFAULT_TIERS)
        problems = cross_field_problems(
            self.tiers, list(enumerate(self.tenants)), list(enumerate(self.backends))
        )
        if problems:
            # One line per problem; validation_problems() turns them back into lines.
            raise ValueError("\n".join(problems))
        return self

    def tenant_by_digest(self) -> dict[str, TenantConfig]:
        return {k.digest: t for t in self.tenants for k in t.api_keys}


def merged_tiers(tiers: dict[str, TierSpec]) -> dict[str, TierSpec]:
    """An operator's tier table merged over the contract's defaults (names checked)."""
    for name in tiers:
        if name == CUSTOM_TIER:
            raise ValueError(f"'{CUSTOM_TIER}' is reserved for explicit ttft/tds")
        if not _NAME.match(name):
            raise ValueError(f"tier name {name!r}: letters, digits, '.', '_', ':', '-'")
    return {**DEFAULT_TIERS, **tiers}


def cross_field_problems(
    tiers: dict[str, TierSpec] | None,
    tenants: list[tuple[int, TenantConfig]],
    backends: list[tuple[int, BackendConfig]],
) -> list[str]:
    """``key: reason`` lines for what no single field can check: duplicate names and keys,
    tenants' tiers that the table lacks (``tiers`` None: the table is itself invalid, so
    not checked), unknown backend kinds. Tenants and backends come with their index in
    the file, so that the loader can check those that are valid when others are not."""
    problems: list[str] = []
    seen_names: set[str] = set()
    seen_keys: dict[str, str] = {}
    for i, t in tenants:
        where = f"tenants[{i}]"
        if t.name in seen_names:
            problems.append(f"{where}.name: duplicate tenant name {t.name!r}")
        seen_names.add(t.name)
        for j, k in enumerate(t.api_keys):
            other = seen_keys.get(k.digest)
            if other is not None:
                problems.append(f"{where}.api_keys[{j}]: the same key is already used by {other!r}")
            seen_keys[k.digest] = t.name
        if tiers is None:
            continue
        allowed = t.tiers if t.tiers is not None else list(tiers)
        for j, tier in enumerate(t.tiers or []):
            if tier not in tiers:
                known = _names(tiers)
                problems.append(f"{where}.tiers[{j}]: unknown tier {tier!r}; known: {known}")
        if t.default_tier not in tiers:
            problems.append(
                f"{where}.default_tier: unknown tier {t.default_tier!r}; known: {_names(tiers)}"
            )
        elif t.default_tier not in allowed:
            problems.append(
                f"{where}.default_tier: {t.default_tier!r} is not in this tenant's tiers"
            )
    seen_backends: set[str] = set()
    for i, b in backends:
        if b.name in seen_backends:
            problems.append(f"backends[{i}].name: duplicate backend name {b.name!r}")
        seen_backends.add(b.name)
        if b.kind not in BACKEND_KINDS:
            problems.append(
                f"backends[{i}].kind: unknown backend kind {b.kind!r}; "
                f"known: {', '.join(BACKEND_KINDS)}"
            )
    return problems


def _names(tiers: Iterable[str]) -> str:
    return ", ".join(sorted(tiers))


def new_api_key(prefix: str = "tp-") -> str:
    return prefix + secrets.token_urlsafe(24)
