"""In-process store: the default without Redis, and the local fallback while it is down.

Fair share uses :class:`qos.fairness.VirtualTokenCounter` itself and the queue's order
:func:`gateway.store.queue.admission_order`; the queue, slots and windows follow the same
rules as the Lua scripts of :mod:`gateway.store.redis`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from gateway.store import aggregates
from gateway.store.base import (
    Admission,
    Arrival,
    QoEAggregates,
    QoERecord,
    ReportResult,
    RequestInfo,
    Slot,
    Standing,
    Store,
)
from gateway.store.queue import (
    ADMISSIONS_KEPT,
    Queued,
    admission_interval,
    admission_order,
    at_cap,
    capacity_of,
    capped_last,
)
from gateway.store.ratelimit import RateState, estimate, reset_ms, wait_ms, window_position
from qos.fairness import VirtualTokenCounter


@dataclass(slots=True)
class _Waiter:
    request_id: str
    tenant: str
    model: str
    deadline_ms: float
    weight: float
    prompt: int
    lease_ms: float


def _now_ms() -> float:
    return time.time() * 1000.0


class MemoryStore(Store):
    """One process's state (see the module docstring); bounded by ``max_requests``."""

    def __init__(
        self, max_requests: int = 100_000, max_records: int = 1_000_000, retention_s: int = 0
    ) -> None:
        self.vtc = VirtualTokenCounter()
        self._keys: dict[str, str] = {}
        self._revoked: set[str] = set()
        self.tenants: dict[str, str] = {}
        self._waiters: dict[str, _Waiter] = {}
        self._slots: dict[str, dict[str, float]] = {}
        self._holders: dict[str, str] = {}  # request id -> tenant, of every slot granted
        self._expires_at = math.inf  # no lease ends before this (ms): nothing to expire
        self._weights: dict[str, float] = {}  # tenant -> weight, as last seen
        self._caps: dict[tuple[str, str], int] = {}  # (tenant, model) -> cap, as last seen
        self._admitted: dict[str, deque[float]] = {}  # model -> recent admission times (ms)
        self._windows: dict[str, float] = {}  # "kind:tenant:index" -> count
        self._requests: OrderedDict[str, RequestInfo] = OrderedDict()
        self._reported: set[str] = set()
        self._max_requests = max_requests
        # (unix seconds, record): stamped when read (a record's copy is checked again)
        self._records: deque[tuple[float, QoERecord]] = deque(maxlen=max_records)
        self._retention_s = retention_s  # 0: records are bounded by count only
        self._aggregate_retention_s = retention_s or 7 * 86400
        # (level, bucket start, tenant) -> the bucket's numbers (gateway.store.aggregates)
        self._buckets: dict[tuple[int, int, str], dict[str, float]] = {}
        self._qoe_tenants: set[str] = set()
        self._gc_buckets_at = 0.0
        self._secrets: dict[str, str] = {}
        self._subscribers: dict[str, list[Callable[[bytes], None]]] = {}

    # -- keys -----------------------------------------------------------------------------
    async def seed_keys(self, keys: Mapping[str, str], tenants: Mapping[str, str]) -> None:
        for digest, tenant in keys.items():
            if digest not in self._revoked:
                self._keys[digest] = tenant
        self.tenants.update(tenants)

    async def tenant_for_key(self, digest: str) -> str | None:
        return self._keys.get(digest)

    async def add_key(self, tenant: str, digest: str) -> None:
        if digest in self._revoked:
            raise ValueError("a revoked key cannot be added again")
        self._keys[digest] = tenant

    async def revoke_key(self, tenant: str, digest: str) -> bool:
        if self._keys.get(digest) != tenant:
            return False
        del self._keys[digest]
        self._revoked.add(digest)
        return True

    async def tenant_keys(self, tenant: str) -> list[str]:
        return sorted(d for d, t in self._keys.items() if t == tenant)

    # -- windows --------------------------------------------------------------------------
    def _window(self, kind: str, tenant: str, idx: int) -> tuple[float, float]:
        w = self._windows
        return w.get(f"{kind}:{tenant}:{idx - 1}", 0.0), w.get(f"{kind}:{tenant}:{idx}", 0.0)

    def _add(self, kind: str, tenant: str, idx: int, n: float) -> None:
        key = f"{kind}:{tenant}:{idx}"
        self._windows[key] = self._windows.get(key, 0.0) + n

    def _gc_windows(self, idx: int, now_ms: float) -> None:
        def live(key: str) -> bool:
            kind, _, rest = key.partition(":")
            index = int(rest.rpartition(":")[2])
            if kind == "b":  # budget periods: index is the period end in ms
                return index > now_ms
            return index >= idx - 1

        if len(self._windows) > 4096:
            self._windows = {k: v for k, v in self._windows.items() if live(k)}

    # -- admission ------------------------------------------------------------------------
    def _expire(self, now: float) -> None:
        """Drop the queue places and slots whose lease ended: a scan of them all, only
        once the earliest lease may have ended (not on every request)."""
        if now < self._expires_at:
            return
        for rid in [r for r, w in self._waiters.items() if w.lease_ms <= now]:
            self._drop(rid)
        for held in self._slots.values():
            for rid in [r for r, t in held.items() if t <= now]:
                del held[rid]
                self._holders.pop(rid, None)
        leases = [w.lease_ms for w in self._waiters.values()]
        leases += [t for held in self._slots.values() for t in held.values()]
        self._expires_at = min(leases, default=math.inf)

    def _leased(self, until: float) -> float:
        """``until``, a lease's end, noted if it is the earliest."""
        if until < self._expires_at:
            self._expires_at = until
        return until

    def _drop(self, rid: str) -> _Waiter | None:
        w = self._waiters.pop(rid, None)
        if w is not None:
            self.vtc.dequeue(w.tenant)
        return w

    def _order(self, model: str, slots: Sequence[Slot]) -> tuple[list[str], bool]:
        """The model's queued requests in admission order (gateway.store.queue), and
        whether the first may be admitted (its tenant is below its cap)."""
        holds: dict[str, int] = {}
        for slot in slots:
            for rid in self._slots.get(slot.backend, {}):
                tenant = self._holders.get(rid)
                if tenant is not None:
                    holds[tenant] = holds.get(tenant, 0) + 1
        queued = [
            Queued(w.request_id, w.tenant, w.deadline_ms)
            for w in self._waiters.values()
            if w.model == model
        ]
        capacity = capacity_of([s.capacity for s in slots])
        order = admission_order(queued, holds, self._weights, self.vtc.counters, capacity)
        tenant_of = {q.request_id: q.tenant for q in queued}
        caps = {t: cap for (t, m), cap in self._caps.items() if m == model}
        order = capped_last(order, tenant_of, holds, caps)
        return order, bool(order) and not at_cap(tenant_of[order[0]], holds, caps)

    def _try(self, rid: str, slots: Sequence[Slot], lease_s: float, now: float) -> Admission:
        w = self._waiters.get(rid)
        if w is None:
            return Admission("gone")
        # alone and uncapped, it is the head of its queue: no order to compute
        if len(self._waiters) > 1 or (w.tenant, w.model) in self._caps:
            order, open_head = self._order(w.model, slots)
            head = order[0] if open_head else None
            if head != rid:
                return Admission("queued", head=head, counter=self.vtc.counter(w.tenant))
        for slot in slots:
            held = self._slots.setdefault(slot.backend, {})
            if slot.candidate and (slot.capacity <= 0 or len(held) < slot.capacity):
                held[rid] = self._leased(now + lease_s * 1000)
                self._holders[rid] = w.tenant
                self._drop(rid)
                admitted = self._admitted.setdefault(w.model, deque(maxlen=ADMISSIONS_KEPT))
                admitted.append(now)
                self.vtc.charge(w.tenant, w.weight, prompt_tokens=w.prompt)
                counter = self.vtc.counter(w.tenant)
                return Admission("admitted", backend=slot.backend, counter=counter)
        return Admission("full", head=rid, counter=self.vtc.counter(w.tenant))

    async def arrive(self, req: Arrival, slots: Sequence[Slot], lease_s: float) -> Admission:
        now = _now_ms()
        self._expire(now)
        lim = req.limits
        idx, frac = window_position(now)
        self._gc_windows(idx, now)
        rate = RateState()
        cost = req.prompt_tokens + req.expected_tokens
        if lim.requests_per_minute or lim.tokens_per_minute:
            rp, rc = self._window("r", req.tenant, idx)
            tp, tc = self._window("t", req.tenant, idx)
            rate = RateState(
                lim.requests_per_minute,
                math.floor(lim.requests_per_minute - estimate(rp, rc, frac) - 1),
                reset_ms(rp, rc + 1, frac),
                lim.tokens_per_minute,
                math.floor(lim.tokens_per_minute - estimate(tp, tc, frac) - req.prompt_tokens),
                reset_ms(tp, tc + req.prompt_tokens, frac),
            )
            if lim.requests_per_minute:
                wait = wait_ms(lim.requests_per_minute, 1, rp, rc, frac)
                if wait != 0:
                    return Admission("limited", None, None, 0.0, wait, "requests", rate)
            if lim.tokens_per_minute:
                wait = wait_ms(lim.tokens_per_minute, cost, tp, tc, frac)
                if wait != 0:
                    return Admission("limited", None, None, 0.0, wait, "tokens", rate)
        period_end = 0
        if lim.token_budget:
            period_ms = lim.budget_period_s * 1000
            period_end = int((now // period_ms + 1) * period_ms)
            used = self._windows.get(f"b:{req.tenant}:{period_end}", 0.0)
            if used + req.prompt_tokens > lim.token_budget:
                return Admission(
                    "limited", retry_after_ms=period_end - now, limited_by="budget", rate=rate
                )
        if lim.max_queued and self.vtc.queued.get(req.tenant, 0) >= lim.max_queued:
            return Admission("queue_full", retry_after_ms=1000, rate=rate)
        self._add("r", req.tenant, idx, 1)
        self._add("t", req.tenant, idx, req.prompt_tokens)
        if period_end:
            self._add("b", req.tenant, period_end, req.prompt_tokens)
        await self.remember(
            req.request_id, RequestInfo(req.tenant, req.tier, req.ttft_s, req.tds, req.model)
        )
        self.vtc.enqueue(req.tenant)
        self._weights[req.tenant] = req.weight
        if lim.max_concurrent:
            self._caps[req.tenant, req.model] = lim.max_concurrent
        else:
            self._caps.pop((req.tenant, req.model), None)
        self._waiters[req.request_id] = _Waiter(
            req.request_id,
            req.tenant,
            req.model,
            now + req.ttft_s * 1000,
            req.weight,
            req.prompt_tokens,
            self._leased(now + lease_s * 1000),
        )
        result = self._try(req.request_id, slots, lease_s, now)
        position, wait_s = 0, 0.0
        if result.status != "admitted":
            position = self._order(req.model, slots)[0].index(req.request_id) + 1
            wait_s = position * admission_interval(self._admitted.get(req.model, ()), now)
        return Admission(
            result.status,
            result.backend,
            result.head,
            result.counter,
            rate=rate,
            position=position,
            wait_s=wait_s,
        )

    async def retry(self, request_id: str, slots: Sequence[Slot], lease_s: float) -> Admission:
        now = _now_ms()
        self._expire(now)
        w = self._waiters.get(request_id)
        if w is not None:
            w.lease_ms = self._leased(now + lease_s * 1000)
        return self._try(request_id, slots, lease_s, now)

    async def standing(
        self, model: str, request_ids: Sequence[str], slots: Sequence[Slot]
    ) -> Standing:
        now = _now_ms()
        self._expire(now)
        place = {rid: i for i, rid in enumerate(self._order(model, slots)[0], 1)}
        asked = {rid: place[rid] for rid in request_ids if rid in place}
        return Standing(asked, admission_interval(self._admitted.get(model, ()), now))

    async def leave(self, request_id: str) -> None:
        self._drop(request_id)

    async def move(self, request_id: str, source: str, target: Slot, lease_s: float) -> bool:
        now = _now_ms()
        self._expire(now)
        held = self._slots.setdefault(target.backend, {})
        if 0 < target.capacity <= len(held):
            return False
        self._slots.get(source, {}).pop(request_id, None)
        held[request_id] = self._leased(now + lease_s * 1000)
        return True

    async def release(self, request_id: str, backend: str) -> None:
        self._slots.get(backend, {}).pop(request_id, None)
        self._holders.pop(request_id, None)

    async def renew(
        self, slots: Iterable[tuple[str, str]], waiting: Iterable[str], lease_s: float
    ) -> None:
        until = self._leased(_now_ms() + lease_s * 1000)
        for backend, rid in slots:
            self._slots.setdefault(backend, {})[rid] = until
        for rid in waiting:
            w = self._waiters.get(rid)
            if w is not None:
                w.lease_ms = until

    async def charge(self, usage: Mapping[str, tuple[float, int, int]]) -> dict[str, float]:
        now = _now_ms()
        idx, _ = window_position(now)
        out: dict[str, float] = {}
        for tenant, (weight, tokens, period_s) in usage.items():
            self.vtc.charge(tenant, weight, output_tokens=tokens)
            self._add("t", tenant, idx, tokens)
            period_ms = period_s * 1000
            self._add("b", tenant, int((now // period_ms + 1) * period_ms), tokens)
            out[tenant] = self.vtc.counter(tenant)
        return out

    async def counters(self) -> dict[str, float]:
        return dict(self.vtc.counters)

    async def merge_counters(self, counters: Mapping[str, float]) -> None:
        for tenant, value in counters.items():
            self.vtc.counters[tenant] = max(self.vtc.counter(tenant), value)

    async def in_flight(self, backend: str) -> int:
        self._expire(_now_ms())
        return len(self._slots.get(backend, {}))

    async def hit(self, tenant: str, name: str, limit: int) -> tuple[bool, float]:
        return self._hit("x" + name, tenant, limit)

    async def count_request(self, tenant: str, limit: int) -> tuple[bool, float]:
        return self._hit("r", tenant, limit)

    def _hit(self, kind: str, tenant: str, limit: int) -> tuple[bool, float]:
        idx, frac = window_position(_now_ms())
        prev, cur = self._window(kind, tenant, idx)
        wait = wait_ms(limit, 1, prev, cur, frac)
        if wait != 0:
            return False, wait
        self._add(kind, tenant, idx, 1)
        return True, 0.0

    # -- requests and telemetry -----------------------------------------------------------
    async def remember(self, request_id: str, info: RequestInfo) -> None:
        if self._max_requests <= 0:
            return
        self._requests[request_id] = info
        if len(self._requests) > self._max_requests:
            old, _ = self._requests.popitem(last=False)
            self._reported.discard(old)

    async def request_info(self, request_id: str) -> RequestInfo | None:
        info = self._requests.get(request_id)
        if info is not None and request_id in self._reported:
            return dataclasses.replace(info, reported=True)
        return info

    def _ownership(self, rec: QoERecord) -> ReportResult:
        """A client record's check: its tenant's request, not reported yet."""
        info = self._requests.get(rec.request_id)
        if info is None or info.tenant != rec.tenant:
            return "unknown"
        return "duplicate" if rec.request_id in self._reported else "ok"

    async def add_qoe(self, records: Sequence[QoERecord]) -> list[ReportResult]:
        out: list[ReportResult] = []
        stored: list[QoERecord] = []
        now = time.time()
        for rec in records:
            result = self._ownership(rec) if rec.side == "client" else "ok"
            if result == "ok":
                self._store(rec, now)
                stored.append(rec)
            out.append(result)
        self._aggregate(stored, now)
        return out

    async def add_report(self, record: QoERecord, per_minute: int) -> tuple[ReportResult, float]:
        result = self._ownership(record)
        if result != "ok":
            return result, 0.0
        allowed, wait = await self.hit(record.tenant, "tel", per_minute)
        if not allowed:
            return "limited", wait
        now = time.time()
        self._store(record, now)
        self._aggregate([record], now)
        return "ok", 0.0

    def _store(self, rec: QoERecord, now: float) -> None:
        if rec.side == "client":
            self._reported.add(rec.request_id)
        self._records.append((rec.ts or now, rec))
        if self._retention_s:
            while self._records and self._records[0][0] < now - self._retention_s:
                self._records.popleft()

    def _aggregate(self, records: Sequence[QoERecord], now: float) -> None:
        """Add ``records`` to the buckets of every level (gateway.store.aggregates)."""
        second = math.floor(now)
        for tenant, (sums, maxima) in aggregates.contributions(records).items():
            self._qoe_tenants.add(tenant)
            for level, lvl in enumerate(aggregates.LEVELS):
                start = second - second % lvl.size_s
                bucket = self._buckets.setdefault((level, start, tenant), {})
                for name, value in sums.items():
                    bucket[name] = bucket.get(name, 0.0) + value
                for name, value in maxima.items():
                    bucket[name] = max(bucket.get(name, 0.0), value)
        if now >= self._gc_buckets_at:
            self._gc_buckets_at = now + aggregates.LEVELS[0].size_s
            retention = self._aggregate_retention_s
            self._buckets = {
                k: v
                for k, v in self._buckets.items()
                if aggregates.kept(k[0], k[1], now, retention)
            }

    async def qoe_records(self, since: float, tenant: str | None = None) -> list[QoERecord]:
        return [
            dataclasses.replace(r, ts=ts)
            for ts, r in self._records
            if ts >= since and (tenant is None or r.tenant == tenant)
        ]

    async def qoe_window(self, window_s: float, tenant: str | None = None) -> QoEAggregates:
        plan = aggregates.plan(time.time(), window_s, self._aggregate_retention_s)
        tenants = [tenant] if tenant is not None else sorted(self._qoe_tenants)
        out: QoEAggregates = {}
        for name in tenants:
            for level, start in plan:
                bucket = self._buckets.get((level, start, name))
                if bucket is not None:
                    aggregates.merge_into(out, name, bucket)
        return out

    async def shared_secret(self, name: str, candidate: str) -> str:
        return self._secrets.setdefault(name, candidate)

    # -- messages: this process's subscribers only -------------------------------------------
    async def publish(self, channel: str, message: bytes) -> None:
        for handler in self._subscribers.get(channel, ()):
            handler(message)

    def subscribe(self, channel: str, handler: Callable[[bytes], None]) -> None:
        self._subscribers.setdefault(channel, []).append(handler)
