"""What the gateway knows about one request, as typed records, and where a request's
ASGI scope keeps them.

- :class:`ResolvedTier`: the tier a request is served under (resolved by
  :mod:`gateway.request.tiers`).
- :class:`Caller`: who made a request, as :mod:`gateway.http.auth` authenticated it.
- :class:`RequestRecord`: made by the middleware when a request arrives; the route
  fills in its labels (tenant, tier, model, backend) and, at the end, how it went. The
  middleware counts and logs the request from it.
- :class:`RequestContext`: what the gateway decided about a completion request, handed
  to the backend with the body.
- :class:`StreamOutcome`: what the relay measured on a finished stream, and
  :class:`Emissions`, when a completed stream's tokens went out (its QoE is measured
  from them in batches, :mod:`gateway.telemetry.replies`).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from starlette.types import Scope, Send

from gateway.config.schema import OVERLOAD_AFTER_TTFTS

if TYPE_CHECKING:
    from gateway.config.schema import TenantConfig

Endpoint = Literal["chat.completions", "completions"]
Outcome = Literal["completed", "error", "aborted"]
UNKNOWN = "-"  # the label of what is not known (yet): no tenant before authentication
RECORD_KEY = "tokenpace"  # scope["state"][RECORD_KEY]: the request's RequestRecord
SERVER_SEND_KEY = "tokenpace.server_send"  # scope["state"][...]: the server's own send


@dataclass(frozen=True, slots=True)
class ResolvedTier:
    name: str  # a tier of the table, or "custom" for explicit numbers
    ttft: float
    tds: float
    priority: int
    overload_after_s: float | None = None  # None: OVERLOAD_AFTER_TTFTS x ttft

    @property
    def wait_bound_s(self) -> float:
        """How long a request of this tier may wait for an engine before it is overloaded."""
        if self.overload_after_s is not None:
            return self.overload_after_s
        return OVERLOAD_AFTER_TTFTS * self.ttft

    def headers(self) -> dict[str, str]:
        return {
            "X-TokenPace-Tier": self.name,
            "X-TokenPace-TTFT": format_number(self.ttft),
            "X-TokenPace-TDS": format_number(self.tds),
        }


def format_number(x: float) -> str:
    """Shortest decimal that reads back as ``x`` ("1.0", "4.8", "0.5", "25.0")."""
    return repr(float(x))


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
    # a stream carrying more output tokens is cut there (max_tokens × n); None: no cap
    max_output_tokens: int | None = None


@dataclass(slots=True)
class StreamOutcome:
    """How a relayed stream ended and what the gateway measured of it."""

    outcome: Outcome
    backend: str
    tokens: int  # output tokens (the backend's usage count when it sent one)
    ttft_s: float | None = None  # receipt to the first token, as emitted
    error: str | None = None  # the message of the error event that ended it
    emissions: Emissions | None = None  # a completed stream's, with a token at least


@dataclass(frozen=True, slots=True)
class Emissions:
    """When a stream's tokens went out: each write that carried tokens, its time (seconds
    since the request was received) and its tokens, a timeline of
    :mod:`qos.timeline`'s per-chunk form."""

    times: array[float]
    counts: array[int]


@dataclass(frozen=True, slots=True)
class Caller:
    """Who made a request: a tenant (by its API key, or by a telemetry token), the operator
    (the admin key), or nobody in particular (a route with no credential, or /metrics
    with its token)."""

    tenant: TenantConfig | None = None
    admin: bool = False
    report_on: str | None = None  # a telemetry token's request: the one it may report on


@dataclass(slots=True)
class RequestRecord:
    """One HTTP request's labels and results, for the request counter and access log."""

    request_id: str
    received_at: float  # time.monotonic()
    caller: Caller | None = None  # who is calling, once authenticated
    tenant_name: str = UNKNOWN
    tier: str = UNKNOWN
    model: str | None = None
    backend: str = UNKNOWN
    outcome: Outcome | None = None  # None: from the status (error at 400 and above)
    tokens: int | None = None
    ttft_s: float | None = None
    error: str | None = None
    error_code: str | None = None  # an error answer's code (or type): what the client got

    def authenticated(self, caller: Caller) -> None:
        self.caller = caller
        if caller.tenant is not None:
            self.tenant_name = caller.tenant.name

    def finished_stream(self, result: StreamOutcome) -> None:
        self.backend = result.backend
        self.outcome = result.outcome
        self.tokens = result.tokens
        self.ttft_s = None if result.ttft_s is None else round(result.ttft_s, 6)
        self.error = result.error

    def log_fields(self) -> dict[str, Any]:
        """The access log line's fields that are known (as the JSON formatter writes them)."""
        fields: dict[str, Any] = {"request_id": self.request_id}
        if self.tenant_name != UNKNOWN:
            fields["tenant"] = self.tenant_name
        if self.tier != UNKNOWN:
            fields["tier"] = self.tier
        names = ("model", "tokens", "ttft_s", "error", "error_code")
        for name in names:
            value = getattr(self, name)
            if value is not None:
                fields[name] = value
        if self.backend != UNKNOWN:
            fields["backend"] = self.backend
        return fields


def request_record(scope: Scope) -> RequestRecord:
    """The record :class:`~gateway.http.middleware.GatewayMiddleware` made for this request."""
    record: RequestRecord = scope["state"][RECORD_KEY]
    return record


def server_send(scope: Scope) -> Send | None:
    """The server's ``send``, under every middleware's wrapper, for a response's body
    messages once its start went through them
    (:class:`~gateway.http.middleware.GatewayMiddleware`)."""
    send: Send | None = scope.get("state", {}).get(SERVER_SEND_KEY)
    return send
