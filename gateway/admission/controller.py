"""Admission: tenants' plans and fair share at the gateway, a queue, backend capacity.

A request is admitted when it is the head of its model's queue (the tenants' plans over
the backends' slots, then VTC, as in "Fairness in Serving Large Language Models", Sheng
et al., between tenants of one weight: :mod:`gateway.store.queue`) and a backend serving
the model has a free slot; otherwise it waits. The queue, the counters and the slots are
in the store, so the order holds across replicas; each replica pumps its own waiters and,
about once a second, asks the store where they stand (their place and estimated wait).

A waiting request is *overloaded* once no engine can start it within its tier's bound
(``overload_after_s``, by default 10 TTFTs): it gets 503 ``overloaded`` at the bound, or
at once where ``admission.overload`` is ``reject`` and the estimated wait is past it. A
stream that waits in ``queue`` mode is answered 200 at once and told its standing
(:meth:`Waiting.ticket`'s ``notify``). docs/architecture/gateway.md, "Fair share across gateway
replicas", has the design and its round trips; docs/protocol.md, "Overload", the answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from gateway.admission.errors import overloaded, queue_full, queue_timeout, rate_limited
from gateway.backends.routing import BackendState, Lease, Routed, Router
from gateway.background import stop
from gateway.config.schema import AdmissionConfig, TenantConfig
from gateway.context import RequestContext
from gateway.errors import GatewayError
from gateway.store import (
    Admission,
    Arrival,
    Limits,
    Slot,
    Store,
    StoreBusy,
    StoreUnavailable,
)
from gateway.store.queue import capacity_of, concurrency_cap
from gateway.store.ratelimit import RateState
from gateway.telemetry.metrics import GatewayMetrics, series

log = logging.getLogger("tokenpace.gateway.admission")

STANDING_INTERVAL_S = 1.0
"""How often a replica asks the store where its waiting requests stand (queue notices)."""
Notify = Callable[[int, float], Awaitable[None]]  # (position, estimated wait in s)


def tenant_limits(t: TenantConfig, max_concurrent: int) -> Limits:
    """``t``'s limits, with ``max_concurrent`` its cap on the model asked for
    (:func:`gateway.store.queue.concurrency_cap`)."""
    return Limits(
        requests_per_minute=t.requests_per_minute or 0,
        tokens_per_minute=t.tokens_per_minute or 0,
        token_budget=t.token_budget or 0,
        budget_period_s=t.budget_period_s,
        max_queued=t.max_queued,
        max_concurrent=max_concurrent,
    )


@dataclass(eq=False)
class Ticket:
    """An admitted request's one hold on the backend that serves it: the store slot
    (global) and the router lease (this replica's load estimate) together.

    Made when the store grants the slot; :meth:`move` takes both to the backend a
    failover goes to; :meth:`close` releases both, once.
    """

    controller: AdmissionController
    request_id: str
    tenant: str
    weight: float
    model: str
    budget_period_s: int
    rate: RateState
    lease: Lease
    closed: bool = field(default=False)

    @property
    def backend(self) -> str:
        """The backend the request holds its slot on (where it runs, or is sent next)."""
        return self.lease.state.name

    def tokens(self, n: int) -> None:
        """``n`` output tokens reached the client: that much less work outstanding on the
        backend (the lease), and charged to the tenant's share in the next batch."""
        if n > 0 and not self.closed:
            self.lease.tokens(n)
            self.controller.add_usage(self.tenant, self.weight, n, self.budget_period_s)

    async def move(self, state: BackendState) -> bool:
        """Hold ``state`` instead (failover): False, and nothing moved, when its slots are
        full (or the ticket is closed). Raises :class:`StoreUnavailable` when the store
        cannot be asked."""
        if self.closed:
            return False
        if state is self.lease.state:
            return True
        return await self.controller.move(self, state)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        await self.controller.release(self)


@dataclass(eq=False)
class _Waiter:
    arrival: Arrival
    deadline: float  # time.monotonic()
    counter: float
    future: asyncio.Future[Admission]
    position: int  # where the store last said it stands (1: next)
    wait_s: float  # ... and its estimated wait
    routed: Routed | None  # what cache-aware routing reads of it
    # resolved (and replaced by the waiting request) when a new standing comes
    update: asyncio.Future[None] | None = None


class Waiting:
    """A request in the queue: :meth:`ticket` waits for its admission. Made by
    :meth:`AdmissionController.arrive`; whoever holds it calls :meth:`ticket` or, if it
    never will (the response was never sent), :meth:`abandon`."""

    def __init__(
        self,
        controller: AdmissionController,
        waiter: _Waiter,
        ctx: RequestContext,
        tenant: TenantConfig,
        rate: RateState,
    ) -> None:
        self._controller = controller
        self._waiter = waiter
        self._ctx = ctx
        self._tenant = tenant
        self.rate = rate
        self._done = False

    @property
    def request_id(self) -> str:
        return self._ctx.request_id

    async def ticket(self, notify: Notify | None = None) -> Ticket:
        """The request's ticket once admitted; ``notify(position, wait_s)`` now and at each
        new standing (about once a second) meanwhile. Raises 503 ``overloaded`` at the
        tier's bound (``queue_timeout`` at ``admission.max_wait_s``, if sooner)."""
        c, w, ctx = self._controller, self._waiter, self._ctx
        bound = ctx.tier.wait_bound_s
        limit = min(bound, c.cfg.max_wait_s)
        loop = asyncio.get_running_loop()
        admitted = False
        try:
            if notify is not None and not w.future.done():
                await notify(w.position, w.wait_s)
            while not w.future.done():
                remaining = ctx.received_at + limit - time.monotonic()
                if remaining <= 0:
                    tenant = w.arrival.tenant
                    c.m_admissions(tenant, "timeout").inc()
                    if limit < bound:
                        raise queue_timeout(c.cfg.max_wait_s)
                    answer = "at_bound" if notify is None else "in_stream"
                    c.m_overloaded(tenant, ctx.tier.name, answer).inc()
                    raise overloaded(ctx.model, bound, w.wait_s, w.wait_s, waited=True)
                w.update = loop.create_future()
                await asyncio.wait(
                    (w.future, w.update), timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
                if notify is not None and w.update.done() and not w.future.done():
                    await notify(w.position, w.wait_s)
            result = w.future.result()
            admitted = True
        finally:
            if not admitted:  # overloaded, timed out, or the client went away (cancelled)
                await self.abandon()
        self._done = True
        c.unregister(w)
        return c.ticket(ctx, self._tenant, result, self.rate, w.routed)

    async def abandon(self) -> None:
        """Leave the queue (or give back the slot granted at that very moment); once."""
        if self._done:
            return
        self._done = True
        await self._controller.abandon(self._waiter)


class AdmissionController:
    """The queue, the slots and the charges of one replica (see the module docstring)."""

    def __init__(
        self,
        cfg: AdmissionConfig,
        caps: Mapping[str, int],
        store: Store,
        router: Router,
        metrics: GatewayMetrics,
        tenants: int,
    ) -> None:
        self.cfg = cfg
        self.tenants = tenants  # how many are configured (the default concurrency cap)
        self.store = store
        self.router = router
        self._caps = dict(caps)  # backend -> max_concurrent (0: no cap)
        self._waiters: dict[str, dict[str, _Waiter]] = {}  # model -> request id -> waiter
        self._pump_locks: dict[str, asyncio.Lock] = {}
        self._held: dict[str, Ticket] = {}
        self._usage: dict[str, list[Any]] = {}  # tenant -> [weight, tokens, budget period]
        self._counters: dict[str, float] = {}
        self._queued = asyncio.Event()  # set while this replica has waiters to poll
        self._charges = asyncio.Event()  # set while output tokens wait to be charged
        self._tasks: list[asyncio.Task[None]] = []
        self._releases: set[asyncio.Task[None]] = set()
        self.m_admissions = series(metrics.admissions)
        self.m_waiting = metrics.queue_waiting
        self.m_overloaded = series(metrics.overloaded)
        self.m_counter = series(metrics.vtc_counter)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        loop = asyncio.get_running_loop()
        # fresh for this loop: an event that has waited is bound to its loop
        self._queued, self._charges = asyncio.Event(), asyncio.Event()
        if self._usage:  # left over from a flush that failed at the last close
            self._charges.set()
        specs: list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = [
            ("poll", self._poll_loop),
            ("charge", self._charge_loop),
            ("heartbeat", self._heartbeat_loop),
            ("standing", self._standing_loop),
        ]
        if any(s.backend.probes_capacity for s in self.router.states):
            interval = self.cfg.metrics_interval_s
            specs.append(("vllm-metrics", lambda: self.router.capacity_loop(interval)))
        for name, fn in specs:
            self._tasks.append(loop.create_task(fn(), name=f"tokenpace-admission-{name}"))

    async def aclose(self) -> None:
        await stop(*self._tasks)
        await asyncio.gather(*self._releases, return_exceptions=True)
        self._tasks.clear()
        with contextlib.suppress(Exception):
            await self._flush_usage()

    # -- backends -------------------------------------------------------------------------
    def slots_for(self, model: str, routed: Routed | None = None) -> list[Slot]:
        """The backends serving ``model``, in routing order; all count in the model's
        slots (the plans' shares), and the store grants the first *candidate* with a free
        slot, which is the backend the request goes to (the one place a backend is
        chosen; failover goes on in the router's order). Candidates have room by their
        own report, and are healthy unless none serving the model is: a slot on an
        unhealthy one while the healthy ones are full would fail over into no room."""
        ranked = self.router.ranked(model, routed=routed)
        any_healthy = any(s.healthy for s in ranked)
        return [
            Slot(
                s.name,
                self._caps.get(s.name, 0),
                candidate=(s.healthy or not any_healthy) and not s.saturated,
            )
            for s in ranked
        ]

    # -- admission ------------------------------------------------------------------------
    async def arrive(
        self,
        ctx: RequestContext,
        tenant: TenantConfig,
        prompt_tokens: int,
        routed: Routed | None = None,
    ) -> Ticket | Waiting:
        """The request's ticket if admitted at once, else its place in the queue; raise
        429 (limits, queue bound) or 503 ``overloaded`` (module doc). ``routed``: what
        cache-aware routing reads of it (:meth:`Router.routed`)."""
        slots = self.slots_for(ctx.model, routed)
        cap = concurrency_cap(
            tenant.max_concurrent, capacity_of([s.capacity for s in slots]), self.tenants
        )
        arrival = Arrival(
            request_id=ctx.request_id,
            tenant=tenant.name,
            weight=tenant.weight,
            model=ctx.model,
            tier=ctx.tier.name,
            ttft_s=ctx.tier.ttft,
            tds=ctx.tier.tds,
            prompt_tokens=prompt_tokens,
            expected_tokens=ctx.expected_tokens,
            limits=tenant_limits(tenant, cap),
        )
        try:
            result = await self.store.arrive(arrival, slots, self.cfg.lease_s)
        except BaseException as exc:
            # timed out with Redis up (busy), or the client left: the script may have run
            # all the same (a store that is down was not asked, or cannot be now)
            if isinstance(exc, StoreBusy) or not isinstance(exc, StoreUnavailable):
                self._spawn_forget(arrival.request_id, slots, ctx.model)
            raise
        rate = result.rate
        self._note(tenant.name, result)
        if result.status == "limited":
            self.m_admissions(tenant.name, "limited").inc()
            raise rate_limited(result.limited_by, result.retry_after_ms, rate)
        if result.status == "queue_full":
            self.m_admissions(tenant.name, "queue_full").inc()
            raise queue_full(tenant.max_queued, result.retry_after_ms, rate)
        if result.status == "admitted":
            self.m_admissions(tenant.name, "admitted").inc()
            return self.ticket(ctx, tenant, result, rate, routed)
        self.m_admissions(tenant.name, "queued").inc()
        bound = ctx.tier.wait_bound_s
        if bound <= 0 or (self.cfg.overload == "reject" and result.wait_s > bound):
            self.m_overloaded(tenant.name, ctx.tier.name, "at_arrival").inc()
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await self.store.leave(arrival.request_id)
            self._kick(arrival.model)
            late = result.wait_s - bound
            raise overloaded(ctx.model, bound, result.wait_s, late, waited=False)
        loop = asyncio.get_running_loop()
        waiter = _Waiter(
            arrival,
            ctx.received_at + ctx.tier.ttft,
            result.counter,
            loop.create_future(),
            result.position,
            result.wait_s,
            routed,
        )
        self._waiters.setdefault(arrival.model, {})[arrival.request_id] = waiter
        self._queued.set()
        self.m_waiting.inc()
        return Waiting(self, waiter, ctx, tenant, rate)

    def ticket(
        self,
        ctx: RequestContext,
        tenant: TenantConfig,
        result: Admission,
        rate: RateState,
        routed: Routed | None = None,
    ) -> Ticket:
        """The ticket of a request the store admitted (``result``); ``rate``: its tenant's
        rate-limit state at its arrival."""
        if result.status != "admitted" or result.backend is None:
            raise ValueError(f"not admitted: {result}")
        state = self.router.state(result.backend)
        lease = self.router.acquire(state, ctx.expected_tokens, routed)
        ticket = Ticket(
            self,
            ctx.request_id,
            tenant.name,
            tenant.weight,
            ctx.model,
            tenant.budget_period_s,
            rate,
            lease,
        )
        self._held[ctx.request_id] = ticket
        return ticket

    async def refused(self, tenant: TenantConfig, error: GatewayError) -> GatewayError:
        """A request of ``tenant`` refused before admission (a 4xx: malformed, not in the
        plan, an unknown model, too large) counts against its requests per minute as an
        admitted one does, so failures are no free way to make the gateway work: the
        answer is ``error``, or 429 once the window is full (the refusal then not
        counted). A store that cannot be asked leaves ``error`` as it is."""
        rpm = tenant.requests_per_minute
        if not rpm or not 400 <= error.status < 500 or error.status in (401, 429):
            return error
        try:
            allowed, wait = await self.store.count_request(tenant.name, rpm)
        except StoreUnavailable:
            return error
        if allowed:
            return error
        self.m_admissions(tenant.name, "limited").inc()
        return rate_limited("requests", wait, RateState(rpm, 0, wait))

    def unregister(self, waiter: _Waiter) -> None:
        """``waiter`` was admitted (once)."""
        self._waiters.get(waiter.arrival.model, {}).pop(waiter.arrival.request_id, None)
        self.m_waiting.dec()
        self.m_admissions(waiter.arrival.tenant, "admitted").inc()

    async def abandon(self, waiter: _Waiter) -> None:
        """``waiter`` gives up (once): it leaves the queue, or gives back the slot it was
        granted meanwhile."""
        a = waiter.arrival
        self._waiters.get(a.model, {}).pop(a.request_id, None)
        self.m_waiting.dec()
        self.m_admissions(a.tenant, "gone_away").inc()
        if waiter.future.done() and not waiter.future.cancelled():
            self._spawn_release(a.request_id, waiter.future.result().backend or "", a.model)
        else:
            waiter.future.cancel()  # the pump leaves it to us now
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await self.store.leave(a.request_id)
            self._kick(a.model)

    def _note(self, tenant: str, result: Admission) -> None:
        if result.status in ("admitted", "queued", "full"):
            self._counters[tenant] = result.counter
            self.m_counter(tenant).set(result.counter)

    def _kick(self, model: str) -> None:
        if self._waiters.get(model):
            self._spawn(self.pump(model))

    async def pump(self, model: str) -> None:
        """Admit this replica's waiters for ``model`` while they are the global head."""
        lock = self._pump_locks.setdefault(model, asyncio.Lock())
        async with lock:
            queue = self._waiters.get(model)
            tried: set[str] = set()
            head: str | None = None
            while queue:
                if head is not None and head in queue and head not in tried:
                    waiter = queue[head]
                else:
                    pending = [w for rid, w in queue.items() if rid not in tried]
                    if not pending or (head is not None and tried):
                        return  # the head is on another replica
                    waiter = min(
                        pending,
                        key=lambda w: (self._counters.get(w.arrival.tenant, w.counter), w.deadline),
                    )
                rid = waiter.arrival.request_id
                tried.add(rid)
                if waiter.future.done():
                    queue.pop(rid, None)
                    continue
                try:
                    slots = self.slots_for(model, waiter.routed)
                    result = await self.store.retry(rid, slots, self.cfg.lease_s)
                    if result.status == "gone" and not waiter.future.done():
                        # lost (its lease lapsed, or the store restarted empty): queue
                        # again, within its cap (its other limits were passed already)
                        cap = waiter.arrival.limits.max_concurrent
                        again = dataclasses.replace(
                            waiter.arrival, limits=Limits(max_concurrent=cap)
                        )
                        result = await self.store.arrive(again, slots, self.cfg.lease_s)
                except StoreUnavailable:
                    return  # the store is down (fail closed); the next poll tries again
                if waiter.future.done():  # the client left during the call: undo it
                    if result.status == "admitted":
                        self._spawn_release(rid, result.backend or "", model)
                    elif result.status in ("queued", "full"):
                        self._spawn_leave(rid)
                    queue.pop(rid, None)
                    continue
                self._note(waiter.arrival.tenant, result)
                waiter.counter = result.counter
                if result.status == "admitted":
                    queue.pop(rid, None)
                    waiter.future.set_result(result)
                    tried.clear()
                    head = None
                    continue
                if result.status == "full":
                    return  # the head has no room: nobody else would
                head = result.head

    # -- failover, release and charges ----------------------------------------------------
    async def move(self, ticket: Ticket, state: BackendState) -> bool:
        """Move ``ticket``'s slot in the store, then its lease, if ``state`` has room.

        Shielded: a cancelled failover still leaves the ticket naming the backend the
        store counts the slot on, so the release frees that one.
        """
        source = ticket.backend
        with anyio.CancelScope(shield=True):
            moved = await self.store.move(
                ticket.request_id,
                source,
                Slot(state.name, self._caps.get(state.name, 0)),
                self.cfg.lease_s,
            )
        if not moved:
            return False
        if ticket.closed:  # released meanwhile (from ``source``): free what the move took
            self._spawn_release(ticket.request_id, state.name, ticket.model)
            return False
        ticket.lease.move(state)
        self._kick(ticket.model)  # a slot on ``source`` is free
        return True

    async def release(self, ticket: Ticket) -> None:
        self._held.pop(ticket.request_id, None)
        ticket.lease.release()
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await self.store.release(ticket.request_id, ticket.backend)
        self._kick(ticket.model)

    def _spawn(self, coro: Awaitable[None]) -> None:
        async def run() -> None:
            with contextlib.suppress(Exception):
                await coro

        task = asyncio.get_running_loop().create_task(run())
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    def _spawn_release(self, rid: str, backend: str, model: str) -> None:
        async def release() -> None:
            await self.store.release(rid, backend)
            self._kick(model)

        self._spawn(release())

    def _spawn_leave(self, rid: str) -> None:
        self._spawn(self.store.leave(rid))

    def _spawn_forget(self, rid: str, slots: Sequence[Slot], model: str) -> None:
        """Undo whatever an arrival whose answer never came may have done: its queue
        place, or the slot it was granted on any of ``slots``. Each of 192 such calls once
        held a place against its tenant's ``max_queued`` until the lease ran out."""

        async def forget() -> None:
            await self.store.leave(rid)
            for slot in slots:
                await self.store.release(rid, slot.backend)
            self._kick(model)

        self._spawn(forget())

    def add_usage(self, tenant: str, weight: float, tokens: int, period_s: int) -> None:
        entry = self._usage.get(tenant)
        if entry is None:
            self._usage[tenant] = [weight, tokens, period_s]
            self._charges.set()
        else:
            entry[1] += tokens

    async def _flush_usage(self) -> None:
        if not self._usage:
            return
        usage, self._usage = self._usage, {}
        batch = {t: (float(w), int(n), int(p)) for t, (w, n, p) in usage.items()}
        try:
            counters = await self.store.charge(batch)
        except StoreUnavailable:
            for tenant, (w, n, p) in batch.items():  # keep them for the next batch
                self.add_usage(tenant, w, n, p)
            return
        for tenant, value in counters.items():
            self._counters[tenant] = value
            self.m_counter(tenant).set(value)

    async def _charge_loop(self) -> None:
        """Charge the tokens streamed in each ``charge_interval_s``; idle while none are."""
        while True:
            await self._charges.wait()
            await asyncio.sleep(self.cfg.charge_interval_s)
            self._charges.clear()  # the flush takes every token added until now
            try:
                await self._flush_usage()
            except Exception:
                log.warning("charging output tokens failed", exc_info=True)

    async def _poll_loop(self) -> None:
        """Pump this replica's waiters every ``poll_interval_s``; idle while it has none
        (each replica pumps only its own, see the module docstring)."""
        while True:
            await self._queued.wait()
            await asyncio.sleep(self.cfg.poll_interval_s)
            for model in [m for m, q in self._waiters.items() if q]:
                try:
                    await self.pump(model)
                except Exception:
                    log.warning("admission pump failed", exc_info=True)
            if not any(self._waiters.values()):
                self._queued.clear()

    async def _standing_loop(self) -> None:
        """Every ``STANDING_INTERVAL_S`` while this replica has waiters: where they stand,
        one call per model (their queue notices, and the wait their overloaded answer
        reports)."""
        while True:
            await self._queued.wait()
            await asyncio.sleep(STANDING_INTERVAL_S)
            for model, queue in [(m, q) for m, q in self._waiters.items() if q]:
                try:
                    standing = await self.store.standing(model, list(queue), self.slots_for(model))
                except StoreUnavailable:
                    continue
                except Exception:
                    log.warning("reading the queue's standing failed", exc_info=True)
                    continue
                for rid, place in standing.places.items():
                    waiter = queue.get(rid)
                    if waiter is None:
                        continue
                    waiter.position, waiter.wait_s = place, standing.wait_s(rid)
                    if waiter.update is not None and not waiter.update.done():
                        waiter.update.set_result(None)

    async def renew(self) -> None:
        """Renew (or re-create) this replica's slots and queue places in the store."""
        slots = [(t.backend, rid) for rid, t in self._held.items()]
        waiting = [rid for q in self._waiters.values() for rid in q]
        if not (slots or waiting):
            return
        await self.store.renew(slots, waiting, self.cfg.lease_s)
        for backend, rid in slots:
            ticket = self._held.get(rid)
            if ticket is None or ticket.backend != backend:
                # released or moved during the call, which may have re-created the slot
                self._spawn(self.store.release(rid, backend))

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.lease_s / 3)
            try:
                await self.renew()
            except StoreUnavailable:
                pass
            except Exception:
                log.warning("lease renewal failed", exc_info=True)
