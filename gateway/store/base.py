"""The interface of the gateway's shared state, and the values it passes around.

Two implementations with the same behaviour: :class:`gateway.store.memory.MemoryStore`
(one process; also the local fallback while Redis is down) and
:class:`gateway.store.redis.RedisStore` (shared by every replica; each operation is one
Lua script, so every read-modify-write is atomic). ``tests/gateway/store/test_stores.py`` runs one
suite against both. Operations are coarse on purpose: one call is one round trip.

The admission order is the plans' rule over the backends' slots, with VTC between
tenants of one weight (:mod:`gateway.store.queue`). Fair share is the Virtual Token
Counter of the VTC slides (Sheng et al.,
"Fairness in Serving Large Language Models"):
:meth:`Store.arrive` is VTC's *enqueue* (counter lift when the tenant had nothing
queued) and, when the request is the head of the queue and a backend has a free slot,
its *dequeue* with the prompt charge ``w_p·prompt/weight``; :meth:`Store.charge` adds
``w_q·output/weight`` as tokens stream. The rules are :class:`qos.fairness.
VirtualTokenCounter`'s (the memory store uses that class; the Lua is its atomic form).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.errors import SERVER_ERROR, GatewayError
from gateway.store.ratelimit import RateState

Status = Literal["admitted", "queued", "full", "limited", "queue_full", "gone"]


class StoreUnavailable(Exception):
    """The shared store cannot be reached (and the gateway fails closed)."""

    code = "store_unavailable"
    answer = "The gateway's shared state is unavailable; try again shortly."


class StoreBusy(StoreUnavailable):
    """The shared store is up, but this replica could not get a connection to it (or an
    answer from it) within ``store.timeout_s``: the call is refused, the store stays up."""

    code = "store_busy"
    answer = "The gateway's shared state is busy; try again shortly."


def store_unavailable(exc: StoreUnavailable | None = None) -> GatewayError:
    """The answer while the shared store is unreachable (fail closed) or busy: 503,
    Retry-After."""
    kind = exc if exc is not None else StoreUnavailable()
    return GatewayError(
        503, kind.answer, type=SERVER_ERROR, code=kind.code, headers={"Retry-After": "1"}
    )


class StoreCommandError(GatewayError):
    """The shared store refused one command (a Redis error reply): that call fails with a
    500; the store is not down for it (docs/reliability.md, "One tenant cannot take the
    shared state down")."""

    def __init__(self, operation: str) -> None:
        super().__init__(
            500,
            f"The gateway's shared state refused an operation ({operation}); it has been logged.",
            type=SERVER_ERROR,
            code="store_error",
        )


@dataclass(frozen=True, slots=True)
class Limits:
    """A tenant's limits; 0 means none."""

    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    token_budget: int = 0
    budget_period_s: int = 86400
    max_queued: int = 0
    max_concurrent: int = 0  # slots held on the model's backends at once (queue.concurrency_cap)


@dataclass(frozen=True, slots=True)
class Slot:
    """A backend serving the request's model, and its cap on requests in flight (0: none).

    Every backend serving the model counts in its slots (the plans' shares,
    :mod:`gateway.store.queue`); only a ``candidate`` may be granted (healthy, and with
    room by its own report)."""

    backend: str
    capacity: int
    candidate: bool = True


@dataclass(frozen=True, slots=True)
class Arrival:
    """A request asking for admission."""

    request_id: str
    tenant: str
    weight: float
    model: str
    tier: str
    ttft_s: float  # the tier's expected TTFT: the queue deadline is arrival + ttft
    tds: float
    prompt_tokens: int
    expected_tokens: int  # output tokens expected (max_tokens or the routing default)
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True, slots=True)
class Admission:
    """The store's answer to :meth:`Store.arrive` / :meth:`Store.retry`.

    ``admitted``: ``backend`` holds a slot for the request; ``queued``: someone else
    (``head``) goes first; ``full``: the request is the head but no backend has room;
    ``limited``: a rate limit or budget (``limited_by``) refused it, retry after
    ``retry_after_ms`` (-1: never fits); ``queue_full``: the tenant's queue is at its
    bound; ``gone``: the queue no longer knows the request (its lease lapsed, or the
    store restarted empty): arrive again. :meth:`Store.arrive`'s ``queued`` and ``full``
    answers also say where the request stands: ``position`` (1: next) and ``wait_s``,
    the estimated wait (:mod:`gateway.store.queue`).
    """

    status: Status
    backend: str | None = None
    head: str | None = None
    counter: float = 0.0
    retry_after_ms: float = 0.0
    limited_by: str | None = None
    rate: RateState = field(default_factory=RateState)
    position: int = 0
    wait_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Standing:
    """Where queued requests of a model stand: each one's place (1: next to be admitted)
    and the recent interval between the model's admissions, in seconds
    (:func:`gateway.store.queue.admission_interval`)."""

    places: dict[str, int]
    interval_s: float

    def wait_s(self, request_id: str) -> float:
        """The estimated wait of a queued request: its place × the interval."""
        return self.places[request_id] * self.interval_s


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What the store remembers about a request (telemetry ownership, the tier served)."""

    tenant: str
    tier: str
    ttft: float
    tds: float
    model: str
    reported: bool = False  # a client report on it is stored already


MAX_SECONDS = 86_400.0
"""The longest freeze or idle latency a record may hold (a day: a timeline is at most
that long, :data:`gateway.telemetry.reports.MAX_TIMELINE_S`)."""


def _finite(name: str, value: float, low: float, high: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and low <= value <= high):
        raise ValueError(f"QoE record: '{name}' must be a number in [{low}, {high}], got {value!r}")


@dataclass(frozen=True, slots=True)
class QoERecord:
    """One QoE measurement of a request: ``side`` is ``gateway`` or ``client``.

    What the reader saw: ``longest_freeze_s`` and ``freezes`` (:func:`qos.metrics.freezes`,
    counted while the reader watched) and ``idle_s``
    (:func:`qos.metrics.user_idle_latency`, Wang et al. Eq. 9), None when no token reached
    the reader; ``away_s``, the seconds the reader was away, as the client said. Every
    number is checked when the record is made (ValueError): a record the stores hold is
    finite and in range, so no aggregate can become NaN.
    """

    request_id: str
    tenant: str
    tier: str
    side: Literal["gateway", "client"]
    andes: float
    monotone: float
    outcome: str
    displayed_andes: float | None = None  # client side: QoE of what the user was shown
    displayed_monotone: float | None = None
    ts: float = 0.0  # unix seconds, set by the store
    longest_freeze_s: float | None = None
    freezes: int | None = None
    idle_s: float | None = None
    away_s: float | None = None  # client side: seconds the reader was away (None: not said)

    def __post_init__(self) -> None:
        if self.side not in ("gateway", "client"):
            raise ValueError(f"QoE record: 'side' must be gateway or client, got {self.side!r}")
        for name in ("andes", "monotone", "displayed_andes", "displayed_monotone"):
            value = getattr(self, name)
            if value is not None or name in ("andes", "monotone"):
                _finite(name, value, 0.0, 1.0)
        for name in ("longest_freeze_s", "idle_s", "away_s"):
            value = getattr(self, name)
            if value is not None:
                _finite(name, value, 0.0, MAX_SECONDS)
        if self.freezes is not None and not (
            isinstance(self.freezes, int) and 0 <= self.freezes < 2**53
        ):
            raise ValueError(f"QoE record: 'freezes' must be a count, got {self.freezes!r}")

    @property
    def reader(self) -> bool:
        """Whether the record holds what the reader saw (some token reached them)."""
        return self.longest_freeze_s is not None and self.idle_s is not None

    def fields(self) -> dict[str, str]:
        out = {
            "rid": self.request_id,
            "tenant": self.tenant,
            "tier": self.tier,
            "side": self.side,
            "andes": repr(self.andes),
            "monotone": repr(self.monotone),
            "outcome": self.outcome,
        }
        optional = (
            ("dandes", self.displayed_andes),
            ("dmono", self.displayed_monotone),
            ("lf", self.longest_freeze_s),
            ("nf", self.freezes),
            ("idle", self.idle_s),
            ("away", self.away_s),
        )
        out.update((key, repr(value)) for key, value in optional if value is not None)
        return out

    @classmethod
    def from_fields(cls, f: Mapping[str, Any], ts: float) -> QoERecord:
        """The record a store row holds; ValueError for a row that is not one (missing
        fields, a number that is not, or out of range): readers skip such rows."""

        def number(key: str) -> float | None:
            return float(f[key]) if key in f else None

        try:
            freezes = number("nf")
            return cls(
                request_id=f["rid"],
                tenant=f["tenant"],
                tier=f["tier"],
                side=f["side"],
                andes=float(f["andes"]),
                monotone=float(f["monotone"]),
                outcome=f["outcome"],
                displayed_andes=number("dandes"),
                displayed_monotone=number("dmono"),
                ts=ts,
                longest_freeze_s=number("lf"),
                freezes=None if freezes is None else int(freezes),
                idle_s=number("idle"),
                away_s=number("away"),
            )
        except (KeyError, TypeError, OverflowError) as exc:
            raise ValueError(f"QoE record: {exc!r}") from None


# "buffered": accepted while the shared store is unreachable, written when it returns;
# "limited": the tenant's telemetry rate limit refused it (nothing written)
ReportResult = Literal["ok", "duplicate", "unknown", "buffered", "limited"]

# (tenant, tier, side) -> the aggregate's fields (gateway.store.aggregates)
QoEAggregates = dict[tuple[str, str, str], dict[str, float]]


class Store(ABC):
    """The gateway's shared state (see the module docstring)."""

    async def start(self) -> None:
        """Connect (called by the app's lifespan)."""

    async def aclose(self) -> None:
        """Disconnect."""

    # -- API keys --------------------------------------------------------------------
    @abstractmethod
    async def seed_keys(self, keys: Mapping[str, str], tenants: Mapping[str, str]) -> None:
        """Register ``digest -> tenant`` (from the configuration) unless revoked, and the
        tenants' descriptions (``name -> JSON``)."""

    @abstractmethod
    async def tenant_for_key(self, digest: str) -> str | None: ...

    @abstractmethod
    async def add_key(self, tenant: str, digest: str) -> None: ...

    @abstractmethod
    async def revoke_key(self, tenant: str, digest: str) -> bool:
        """Revoke one of ``tenant``'s keys for good (also a configured one); False if not its."""

    @abstractmethod
    async def tenant_keys(self, tenant: str) -> list[str]:
        """The digests of ``tenant``'s live keys, sorted."""

    # -- admission (VTC queue, slots, limits) -----------------------------------------
    @abstractmethod
    async def arrive(self, req: Arrival, slots: Sequence[Slot], lease_s: float) -> Admission:
        """Limits, remember the request, enqueue (counter lift), admit if head and room."""

    @abstractmethod
    async def retry(self, request_id: str, slots: Sequence[Slot], lease_s: float) -> Admission:
        """Admit a queued request if it is now the head and a slot is free; renew its place."""

    @abstractmethod
    async def standing(
        self, model: str, request_ids: Sequence[str], slots: Sequence[Slot]
    ) -> Standing:
        """The places of those of ``request_ids`` still queued for ``model`` (``slots``:
        its backends), and the interval between its recent admissions."""

    @abstractmethod
    async def leave(self, request_id: str) -> None:
        """A queued request goes away (its client disconnected, or it waited too long)."""

    @abstractmethod
    async def move(self, request_id: str, source: str, target: Slot, lease_s: float) -> bool:
        """Failover: an admitted request's slot goes from backend ``source`` to ``target``,
        in one step, if ``target`` has a free slot; False (nothing changed) if it is full."""

    @abstractmethod
    async def release(self, request_id: str, backend: str) -> None:
        """An admitted request ended: free its slot."""

    @abstractmethod
    async def renew(
        self, slots: Iterable[tuple[str, str]], waiting: Iterable[str], lease_s: float
    ) -> None:
        """Extend the leases of held ``(backend, request_id)`` slots (re-creating lost ones)
        and of queue places."""

    @abstractmethod
    async def charge(self, usage: Mapping[str, tuple[float, int, int]]) -> dict[str, float]:
        """``tenant -> (weight, output tokens, budget period)``: the output charge, the token
        windows and budgets; returns the tenants' counters."""

    @abstractmethod
    async def counters(self) -> dict[str, float]: ...

    @abstractmethod
    async def merge_counters(self, counters: Mapping[str, float]) -> None:
        """Raise counters to at least the given values (reconciliation after an outage)."""

    @abstractmethod
    async def in_flight(self, backend: str) -> int: ...

    @abstractmethod
    async def hit(self, tenant: str, name: str, limit: int) -> tuple[bool, float]:
        """Count one event against ``limit`` per sliding minute: (allowed, retry-after ms)."""

    @abstractmethod
    async def count_request(self, tenant: str, limit: int) -> tuple[bool, float]:
        """Count one request refused before admission in the requests-per-minute window
        :meth:`arrive` checks (against ``limit``, the tenant's): (allowed, retry-after ms);
        not counted when not allowed."""

    # -- requests and telemetry -----------------------------------------------------------
    @abstractmethod
    async def remember(self, request_id: str, info: RequestInfo) -> None:
        """Remember a request without admission (requests served while the store was down)."""

    @abstractmethod
    async def request_info(self, request_id: str) -> RequestInfo | None: ...

    @abstractmethod
    async def add_qoe(self, records: Sequence[QoERecord]) -> list[ReportResult]:
        """Store records and add each to its aggregates; a client record must be its
        request's first and only report."""

    @abstractmethod
    async def add_report(self, record: QoERecord, per_minute: int) -> tuple[ReportResult, float]:
        """Store a client's report, in one step: its request must be its tenant's and not
        reported yet (``unknown``, ``duplicate``), then it is charged to the tenant's
        telemetry limit of ``per_minute`` reports a sliding minute (``limited``, nothing
        written) and stored. Returns the result and, when ``limited``, the wait in ms."""

    @abstractmethod
    async def qoe_records(self, since: float, tenant: str | None = None) -> list[QoERecord]:
        """Records since unix time ``since`` (every tenant's when ``tenant`` is None); a
        row that does not read as a record is skipped."""

    @abstractmethod
    async def qoe_window(self, window_s: float, tenant: str | None = None) -> QoEAggregates:
        """The aggregates of the last ``window_s`` seconds' records per (tenant, tier,
        side), every tenant's when ``tenant`` is None, read from the time buckets of
        :mod:`gateway.store.aggregates`: the cost does not depend on how many records
        there are."""

    @abstractmethod
    async def shared_secret(self, name: str, candidate: str) -> str:
        """The secret stored under ``name``, storing ``candidate`` first if there is none
        (set if absent: every replica ends up with the first one stored)."""

    # -- messages between replicas (and engines) ----------------------------------------
    @abstractmethod
    async def publish(self, channel: str, message: bytes) -> None:
        """Send ``message`` to every subscriber of ``channel``: every replica on the
        store, and whatever else listens there (the vLLM plugin); at most once, never
        kept for a subscriber that is not listening."""

    @abstractmethod
    def subscribe(self, channel: str, handler: Callable[[bytes], None]) -> None:
        """Call ``handler`` (on the event loop; it must not block) with each message
        published on ``channel`` from now until :meth:`aclose` (within a running loop)."""


# Redis; Redis down and this replica on its local state (fail open) or refusing (fail
# closed); no Redis configured
StoreMode = Literal["redis", "local", "closed", "memory"]


class StoreMonitor:
    """What a store tells about itself: the gateway's metrics implement it
    (:class:`gateway.telemetry.metrics.StoreMetrics`); this one ignores everything."""

    def mode(self, mode: StoreMode) -> None:
        """Where the state lives now (:data:`StoreMode`)."""

    def redis_call(self) -> None:
        """One round trip to Redis (a command, a pipeline or a script)."""

    def pool(self, in_use: int, size: int) -> None:
        """The calls holding one of the ``size`` Redis connections now."""

    def waited(self) -> None:
        """A call waited for a free Redis connection."""

    def local_call(self) -> None:
        """A call served from this replica's local state (Redis down, fail open)."""

    def outage(self) -> None:
        """Redis went from reachable to unreachable."""

    def error(self, kind: Literal["busy", "command"]) -> None:
        """A call refused: no connection or answer in time (busy), or a Redis error reply."""
