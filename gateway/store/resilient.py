"""Redis with a local fallback: what the gateway uses when ``store.redis_url`` is set.

While Redis answers, every operation goes to it and a local
:class:`~gateway.store.memory.MemoryStore` mirrors what this replica learns. What a
failed call means (the gateway's one store timeout is ``store.timeout_s``; callers add
none):

- Redis is **down**: the connection is refused or lost, or a call timed out and Redis
  does not answer a PING on a connection of its own either, or it answers that it
  cannot serve (``LOADING``, ``READONLY``, ``OOM``, ``MISCONF``, ...). Then ``fail_mode:
  open`` serves from the local store, ``closed`` raises
  :class:`~gateway.store.base.StoreUnavailable` (503), and a probe reconnects and
  reconciles (the key table, requests, counters, slots, buffered telemetry).
- Redis is **busy**: no connection of this replica's pool came free in time, a call
  timed out while Redis still answers a PING, or a script is running (``BUSY``). That
  one call is refused (:class:`~gateway.store.base.StoreBusy`, 503 ``store_busy``);
  nothing changes mode.
- a **command error** (any other error reply): that one call fails
  (:class:`~gateway.store.base.StoreCommandError`, 500, logged); nothing changes mode.

Spent token budgets survive a Redis that restarts empty: every replica reads, at each
key-table check, the tokens used in the current budget period of each budgeted tenant
it has served (one script call) and keeps the largest it saw; when it finds the store's
epoch changed (Redis lost its data) it writes them back (a period never goes down: the
largest of what the replicas saw wins) along with the fair-share counters. What is lost
is at most the tokens spent since the last check (``reconnect_interval_s``). The
per-minute rate windows are not restored: a minute later they are whole again.

A slot given back or a queue place left (or admitted from) while Redis is down or busy
is given back locally at once and **owed** to Redis: kept (up to ``buffer_max``) and replayed before
anything else when Redis is reachable again, and at every key-table check while it is
up, until Redis has it. Both are idempotent, so one Redis already ran (a call whose
answer never came) costs nothing. Without this, the streams that ended during a stall
left their slots and places in Redis, and the next request waited for their leases.

docs/architecture/gateway.md, "Fair share across gateway replicas" ("Failure") and "API keys:
what survives what", has the design.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeout

from gateway.background import stop
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
    StoreBusy,
    StoreCommandError,
    StoreMonitor,
    StoreUnavailable,
)
from gateway.store.memory import MemoryStore
from gateway.store.redis import RedisStore

log = logging.getLogger("tokenpace.gateway.store")

_FAILURES = (RedisError, OSError, asyncio.TimeoutError)
# Error replies that say Redis cannot serve at all (not that one command was wrong)
_DOWN_REPLIES = (
    "LOADING",
    "READONLY",
    "OOM",
    "MISCONF",
    "MASTERDOWN",
    "NOREPLICAS",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "NOAUTH",
    "WRONGPASS",
)
_BUSY_REPLY = "BUSY"


def _reply_kind(exc: ResponseError) -> str:
    """``down``, ``busy`` or ``command`` for an error reply (see the module docstring).

    redis-py takes the reply's first word off the message of the replies it has a class
    for (``OOM`` is an ``OutOfMemoryError`` saying "command not allowed ..."), and keeps it
    as ``status_code``: an OOM read as a command error once left waiting streams stuck
    until ``overloaded`` while the engine was free."""
    word = (exc.status_code or str(exc).split(" ", 1)[0]).upper()
    if word in _DOWN_REPLIES:
        return "down"
    return "busy" if word == _BUSY_REPLY else "command"


class ResilientStore(Store):
    """:class:`RedisStore` with a local fallback (see the module docstring)."""

    def __init__(
        self,
        redis: RedisStore,
        local: MemoryStore,
        *,
        fail_open: bool = True,
        reconnect_interval_s: float = 1.0,
        buffer_max: int = 10000,
        monitor: StoreMonitor | None = None,
    ) -> None:
        self.redis = redis
        self.monitor = monitor or StoreMonitor()
        self.local = local
        self.fail_open = fail_open
        self.reconnect_interval_s = reconnect_interval_s
        self.up = False
        self.on_reconnect: Callable[[], Awaitable[None]] | None = None
        # records written locally while Redis was down, each with what its ownership check
        # needs (a Redis that restarted empty no longer knows the request)
        self._buffer: deque[tuple[QoERecord, RequestInfo | None]] = deque(maxlen=buffer_max)
        self._unsynced: dict[str, RequestInfo] = {}
        # slots given back and places left that Redis has not had yet: (request id,
        # backend), "" for a queue place (an ordered set)
        self._owed: dict[tuple[str, str], None] = {}
        # budgeted tenants served (tenant -> period s), and the tokens used per (tenant,
        # period end ms) as last read from Redis
        self._budget_periods: dict[str, int] = {}
        self._budgets_seen: dict[tuple[str, int], float] = {}
        self._unsynced_max = buffer_max
        self._probe: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._liveness: asyncio.Task[bool] | None = None
        self._seed: tuple[dict[str, str], dict[str, str]] = ({}, {})
        # the key table as last read from Redis, and the epoch of the store it came from
        self._keys: dict[str, str] = {}
        self._revoked: set[str] = set()
        self._epoch: str | None = None
        self._keyver = -1
        self.keys_known = False  # False: key administration is refused (fail closed)
        self.persistent: bool | None = None  # Redis writes an append-only file

    # -- connection state -----------------------------------------------------------------
    async def start(self) -> None:
        try:
            await self.redis.ping()
        except _FAILURES as exc:
            self._down(exc)
        else:
            self._set_up()
            log.info("shared state in Redis at %s", _safe_url(self.redis.url))
            await self._check_persistence()
        self._watch = asyncio.get_running_loop().create_task(
            self._watch_keys(), name="tokenpace-redis-keys"
        )

    async def _check_persistence(self) -> None:
        with contextlib.suppress(*_FAILURES):
            self.persistent = await self.redis.persistence()
        if self.persistent is False:
            log.error(
                "Redis persistence is OFF (appendonly no): if Redis restarts while no gateway "
                "replica is running, API keys created through the admin API are lost and "
                "revoked configured keys work again. Set 'appendonly yes' on Redis."
            )
        elif self.persistent is None:
            log.warning(
                "cannot verify Redis persistence (CONFIG GET refused): keys created or "
                "revoked through the admin API are durable only if Redis persists its data"
            )

    async def aclose(self) -> None:
        await stop(*(t for t in (self._probe, self._watch, self._liveness) if t is not None))
        self._probe = self._watch = self._liveness = None
        await self.redis.aclose()

    def _set_up(self) -> None:
        self.up = True
        self.monitor.mode("redis")

    def _down(self, exc: BaseException) -> None:
        if self.up or self._probe is None:
            mode = "serving on local state" if self.fail_open else "refusing requests (503)"
            log.error("Redis unreachable (%s: %s): %s", type(exc).__name__, exc, mode)
        if self.up:
            self.monitor.outage()
        self.up = False
        self.monitor.mode("local" if self.fail_open else "closed")
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(
                self._reconnect(), name="tokenpace-redis-probe"
            )

    async def _alive(self) -> bool:
        """Whether Redis answers a PING on a connection of its own; concurrent callers
        share one check."""
        if self._liveness is None or self._liveness.done():
            self._liveness = asyncio.get_running_loop().create_task(self.redis.alive())
        return await asyncio.shield(self._liveness)

    async def _failed(self, operation: str, exc: BaseException) -> None:
        """Classify a failed call (module docstring): raise StoreBusy or StoreCommandError
        for that call alone, or mark Redis down and return."""
        if isinstance(exc, StoreBusy):
            raise exc
        if isinstance(exc, ResponseError):
            kind = _reply_kind(exc)
            if kind == "command":
                self.monitor.error("command")
                log.error("Redis refused %s: %s", operation, exc)
                raise StoreCommandError(operation) from exc
            if kind == "busy":
                self.monitor.error("busy")
                raise StoreBusy(f"Redis is busy ({exc})") from exc
        elif isinstance(exc, (RedisTimeout, asyncio.TimeoutError)) and await self._alive():
            self.monitor.error("busy")
            raise StoreBusy(f"Redis did not answer {operation} in time, but is up") from exc
        self._down(exc)

    async def _reconnect(self) -> None:
        while True:
            await asyncio.sleep(self.reconnect_interval_s)
            with contextlib.suppress(*_FAILURES):
                await self.redis.reset()
            try:
                await self.redis.ping()
                await self._reconcile()
            except (*_FAILURES, StoreUnavailable) as exc:
                log.debug("Redis still unreachable: %r", exc)
                continue
            self._set_up()
            self._probe = None
            log.warning("Redis reachable again; state reconciled")
            return

    async def _reconcile(self) -> None:
        await self._sync_keys()  # a Redis that restarted empty knows no key
        await self._pay_owed()
        for rid, info in list(self._unsynced.items()):
            await self.redis.remember(rid, info)
            del self._unsynced[rid]
        await self.redis.merge_counters(await self.local.counters())
        if self.on_reconnect is not None:
            await self.on_reconnect()
        while self._buffer:
            batch = [self._buffer.popleft() for _ in range(min(500, len(self._buffer)))]
            try:
                for rec, owner in batch:
                    if owner is not None:  # fields only: a 'reported' mark already there stays
                        await self.redis.remember(rec.request_id, owner)
                results: list[ReportResult | str]
                try:
                    results = list(await self.redis.add_qoe([rec for rec, _ in batch]))
                except ResponseError:
                    results = await self._replay_singly(batch)
            except BaseException:
                self._buffer.extendleft(reversed(batch))
                raise
            for (rec, _), result in zip(batch, results, strict=True):
                if result not in ("ok", "dropped"):  # a second report made during the outage
                    log.warning("buffered %s record of %s: %s", rec.side, rec.request_id, result)

    async def _replay_singly(
        self, batch: list[tuple[QoERecord, RequestInfo | None]]
    ) -> list[ReportResult | str]:
        """Write a batch Redis refused one record at a time, dropping (and logging) the
        records it refuses: one poison record never holds the others, nor the reconnect,
        back."""
        results: list[ReportResult | str] = []
        for rec, _ in batch:
            try:
                results += await self.redis.add_qoe([rec])
            except ResponseError as exc:
                if _reply_kind(exc) != "command":
                    raise
                log.error(
                    "buffered %s record of %s refused by Redis, dropped: %s",
                    rec.side,
                    rec.request_id,
                    exc,
                )
                results.append("dropped")
        return results

    async def _redis(self, name: str, *args: Any) -> tuple[bool, Any]:
        """(True, result) from Redis, or (False, None) when it is down (fail open)."""
        if self.up:
            try:
                return True, await getattr(self.redis, name)(*args)
            except _FAILURES as exc:
                await self._failed(name, exc)
        if not self.fail_open:
            raise StoreUnavailable("the shared state store (Redis) is unreachable")
        self.monitor.local_call()
        return False, None

    async def _either(self, name: str, *args: Any) -> Any:
        ok, result = await self._redis(name, *args)
        return result if ok else await getattr(self.local, name)(*args)

    # -- keys -----------------------------------------------------------------------------
    async def _sync_keys(self) -> None:
        """Bring the key mirror in step with Redis; restore a store that lost its data."""
        epoch, version = await self.redis.key_state()
        reload = version != self._keyver
        if self._epoch is not None and epoch != self._epoch:
            self.keys_known = False
            log.error(
                "Redis lost its data (store epoch %s, now %s): restoring %d key(s) and %d "
                "revocation(s) from this replica",
                self._epoch,
                epoch or "none",
                len(self._keys),
                len(self._revoked),
            )
            await self.redis.restore_keys(self._keys, self._revoked)
            raised = await self.redis.restore_budgets(self._budgets_seen)
            await self.redis.merge_counters(await self.local.counters())
            log.error("restored %d token budget period(s) from this replica", raised)
        if epoch != self._epoch or epoch is None:
            await self.redis.seed_keys(*self._seed)  # configured keys, unless revoked
            epoch = await self.redis.ensure_epoch(uuid.uuid4().hex)
            reload = True
        if reload:
            self._keys, self._revoked, self._keyver = await self.redis.key_table()
        self._epoch = epoch
        self.keys_known = True

    async def _watch_keys(self) -> None:
        while True:
            await asyncio.sleep(self.reconnect_interval_s)
            if not self.up:
                continue  # the probe reconciles
            try:
                await self._sync_keys()
                await self._pay_owed()
                await self._read_budgets()
            except (*_FAILURES, StoreBusy) as exc:
                with contextlib.suppress(StoreUnavailable, StoreCommandError):
                    await self._failed("the key table check", exc)

    async def seed_keys(self, keys: Mapping[str, str], tenants: Mapping[str, str]) -> None:
        self._seed = (dict(keys), dict(tenants))
        await self.local.seed_keys(keys, tenants)
        if self.up:
            try:
                await self._sync_keys()
            except (*_FAILURES, StoreBusy) as exc:
                with contextlib.suppress(StoreUnavailable, StoreCommandError):
                    await self._failed("seeding the keys", exc)

    async def tenant_for_key(self, digest: str) -> str | None:
        ok, name = await self._redis("tenant_for_key", digest)
        if not ok:
            return await self._offline_tenant(digest)
        if name is None and digest in self._keys:
            # live by the mirror, unknown to Redis: revoked meanwhile, or Redis lost its
            # data; find out which before answering
            try:
                await self._sync_keys()
                name = await self.redis.tenant_for_key(digest)
            except _FAILURES as exc:
                await self._failed("tenant_for_key", exc)
                return await self._offline_tenant(digest)
        return name

    async def _offline_tenant(self, digest: str) -> str | None:
        """While Redis is down (fail open): the mirror, which knows every replica's key
        changes up to the outage; the configured keys if Redis was never reached."""
        if not self.fail_open:
            raise StoreUnavailable("the shared state store (Redis) is unreachable")
        if self._epoch is None:
            return await self.local.tenant_for_key(digest)
        return self._keys.get(digest)

    async def add_key(self, tenant: str, digest: str) -> None:
        await self._strict("add_key", tenant, digest)
        self._keys[digest] = tenant
        with contextlib.suppress(ValueError):
            await self.local.add_key(tenant, digest)

    async def revoke_key(self, tenant: str, digest: str) -> bool:
        ok = await self._strict("revoke_key", tenant, digest)
        if ok:
            self._keys.pop(digest, None)
            self._revoked.add(digest)
        await self.local.revoke_key(tenant, digest)
        return bool(ok)

    async def tenant_keys(self, tenant: str) -> list[str]:
        return await self._strict("tenant_keys", tenant)

    async def _strict(self, name: str, *args: Any) -> Any:
        """Key changes must reach every replica: never made locally only, never while
        this replica's view of the keys is not known to be the store's."""
        if not self.up:
            raise StoreUnavailable("the shared state store (Redis) is unreachable")
        if not self.keys_known:
            raise StoreUnavailable("the API key table is being restored")
        try:
            return await getattr(self.redis, name)(*args)
        except _FAILURES as exc:
            await self._failed(name, exc)
            raise StoreUnavailable("the shared state store (Redis) is unreachable") from exc

    # -- admission ------------------------------------------------------------------------
    def _mirror(self, tenant: str, counter: float) -> None:
        self.local.vtc.counters[tenant] = max(self.local.vtc.counter(tenant), counter)

    async def arrive(self, req: Arrival, slots: Sequence[Slot], lease_s: float) -> Admission:
        if req.limits.token_budget:
            self._budget_periods[req.tenant] = req.limits.budget_period_s
        ok, result = await self._redis("arrive", req, slots, lease_s)
        if not ok:
            result = await self.local.arrive(req, slots, lease_s)
            if result.status in ("admitted", "queued", "full"):
                self._note_unsynced(req)
            if result.status == "admitted":
                self._owe(req.request_id, "")  # queued in Redis before, maybe (a pump's)
            return result
        if result.status in ("admitted", "queued", "full"):
            self._mirror(req.tenant, result.counter)
            await self.local.remember(
                req.request_id, RequestInfo(req.tenant, req.tier, req.ttft_s, req.tds, req.model)
            )
        return result

    def _note_unsynced(self, req: Arrival) -> None:
        if len(self._unsynced) < self._unsynced_max:
            info = RequestInfo(req.tenant, req.tier, req.ttft_s, req.tds, req.model)
            self._unsynced[req.request_id] = info

    async def retry(self, request_id: str, slots: Sequence[Slot], lease_s: float) -> Admission:
        ok, result = await self._redis("retry", request_id, slots, lease_s)
        if ok:
            return result
        result = await self.local.retry(request_id, slots, lease_s)
        if result.status == "admitted":
            self._owe(request_id, "")  # it left Redis' queue too
        return result

    async def standing(
        self, model: str, request_ids: Sequence[str], slots: Sequence[Slot]
    ) -> Standing:
        result: Standing = await self._either("standing", model, request_ids, slots)
        return result

    async def leave(self, request_id: str) -> None:
        await self.local.leave(request_id)
        await self._give_back(request_id, "")

    async def move(self, request_id: str, source: str, target: Slot, lease_s: float) -> bool:
        return bool(await self._either("move", request_id, source, target, lease_s))

    async def release(self, request_id: str, backend: str) -> None:
        await self.local.release(request_id, backend)
        await self._give_back(request_id, backend)

    async def _give_back(self, request_id: str, backend: str) -> None:
        """Free a slot on ``backend`` (a queue place for ``""``) in Redis, or owe it
        (module docstring): never refused, since it was freed locally."""
        args = (request_id, backend) if backend else (request_id,)
        try:
            ok, _ = await self._redis("release" if backend else "leave", *args)
        except StoreUnavailable:
            ok = False
        if not ok:
            self._owe(request_id, backend)

    def _owe(self, request_id: str, backend: str) -> None:
        if len(self._owed) < self._unsynced_max:
            self._owed[(request_id, backend)] = None

    async def _read_budgets(self) -> None:
        """Keep the largest tokens used seen per budget period still running."""
        seen = self._budgets_seen
        for period, used in (await self.redis.budgets(self._budget_periods)).items():
            seen[period] = max(seen.get(period, 0.0), used)
        ended = time.time() * 1000 - 60_000
        for period in [p for p in seen if p[1] < ended]:
            del seen[period]

    async def _pay_owed(self) -> None:
        """Replay the slots and places Redis is owed (raises what Redis raises)."""
        for request_id, backend in list(self._owed):
            if backend:
                await self.redis.release(request_id, backend)
            else:
                await self.redis.leave(request_id)
            del self._owed[(request_id, backend)]

    async def renew(
        self, slots: Iterable[tuple[str, str]], waiting: Iterable[str], lease_s: float
    ) -> None:
        held, queued = list(slots), list(waiting)
        await self.local.renew([], queued, lease_s)
        await self._redis("renew", held, queued, lease_s)

    async def charge(self, usage: Mapping[str, tuple[float, int, int]]) -> dict[str, float]:
        ok, result = await self._redis("charge", usage)
        if not ok:
            return await self.local.charge(usage)
        for tenant, counter in result.items():
            self._mirror(tenant, counter)
        return result

    async def counters(self) -> dict[str, float]:
        return await self._either("counters")

    async def merge_counters(self, counters: Mapping[str, float]) -> None:
        await self.local.merge_counters(counters)
        await self._redis("merge_counters", counters)

    async def in_flight(self, backend: str) -> int:
        return await self._either("in_flight", backend)

    async def hit(self, tenant: str, name: str, limit: int) -> tuple[bool, float]:
        return await self._either("hit", tenant, name, limit)

    async def count_request(self, tenant: str, limit: int) -> tuple[bool, float]:
        return await self._either("count_request", tenant, limit)

    # -- requests and telemetry -----------------------------------------------------------
    async def remember(self, request_id: str, info: RequestInfo) -> None:
        await self.local.remember(request_id, info)
        ok, _ = await self._redis("remember", request_id, info)
        if not ok and len(self._unsynced) < self._unsynced_max:
            self._unsynced[request_id] = info

    async def request_info(self, request_id: str) -> RequestInfo | None:
        ok, result = await self._redis("request_info", request_id)
        if ok and result is not None:
            return result
        return await self.local.request_info(request_id)

    async def add_qoe(self, records: Sequence[QoERecord]) -> list[ReportResult]:
        """Into Redis; while it is down, locally and into the replay buffer: a client
        report is then ``buffered`` (written, with its ownership, when Redis returns), or
        refused (StoreUnavailable) when the buffer is full, never dropped after an answer."""
        ok, result = await self._redis("add_qoe", records)
        if ok:
            return result
        client = any(r.side == "client" for r in records)
        if client and len(self._buffer) + len(records) > (self._buffer.maxlen or 0):
            raise StoreUnavailable("the telemetry buffer is full while Redis is unreachable")
        out: list[ReportResult] = []
        for rec, res in zip(records, await self.local.add_qoe(records), strict=True):
            if res == "ok":
                res = self._buffered(rec, await self.local.request_info(rec.request_id))
            out.append(res)
        return out

    async def add_report(self, record: QoERecord, per_minute: int) -> tuple[ReportResult, float]:
        """As :meth:`add_qoe`, for one client report charged to its tenant's limit."""
        ok, result = await self._redis("add_report", record, per_minute)
        if ok:
            return result
        if len(self._buffer) >= (self._buffer.maxlen or 0):
            raise StoreUnavailable("the telemetry buffer is full while Redis is unreachable")
        res, wait = await self.local.add_report(record, per_minute)
        if res == "ok":
            res = self._buffered(record, await self.local.request_info(record.request_id))
        return res, wait

    def _buffered(self, rec: QoERecord, info: RequestInfo | None) -> ReportResult:
        """Keep a record stored locally for the replay; a client's with its ownership."""
        self._buffer.append((rec, info if rec.side == "client" else None))
        return "buffered" if rec.side == "client" else "ok"

    async def qoe_records(self, since: float, tenant: str | None = None) -> list[QoERecord]:
        return await self._either("qoe_records", since, tenant)

    async def qoe_window(self, window_s: float, tenant: str | None = None) -> QoEAggregates:
        return await self._either("qoe_window", window_s, tenant)

    async def shared_secret(self, name: str, candidate: str) -> str:
        """From Redis only (a secret of this replica's own would not verify elsewhere)."""
        return await self._strict("shared_secret", name, candidate)

    # -- messages -------------------------------------------------------------------------
    async def publish(self, channel: str, message: bytes) -> None:
        """On Redis; while it is down (fail open), to this replica's own subscribers."""
        ok, _ = await self._redis("publish", channel, message)
        if not ok:
            await self.local.publish(channel, message)

    def subscribe(self, channel: str, handler: Callable[[bytes], None]) -> None:
        """Redis's messages and, while it is down, this replica's own."""
        self.redis.subscribe(channel, handler)
        self.local.subscribe(channel, handler)


def _safe_url(url: str) -> str:
    """The URL without a password."""
    head, sep, tail = url.rpartition("@")
    if not sep:
        return url
    scheme, _, _ = head.partition("://")
    return f"{scheme}://***@{tail}"
