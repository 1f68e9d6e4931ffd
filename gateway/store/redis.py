"""The shared store in Redis (redis-py asyncio): every read-modify-write one Lua script.

The scripts are the atomic form of :class:`qos.fairness.VirtualTokenCounter` (enqueue
with counter lift, dequeue, charge; ``w_p``/``w_q`` are passed in from
:mod:`qos.fairness`, never written here), of the queue's order and wait estimate
(:mod:`gateway.store.queue`, whose constants are passed in too) and of
:mod:`gateway.store.ratelimit`'s windows;
``tests/gateway/store/test_stores.py`` checks them against the Python on the same events. Times are
the Redis server's (``TIME``), so replicas need no synchronised clocks.

Keys (all under ``{prefix}:``; the braces make them one Redis Cluster hash slot):

=====================  ==========================================================
``vtc``                HASH tenant -> counter
``last``               STRING the tenant that last left the queue (VTC lift)
``wn``                 HASH tenant -> requests queued (all models)
``w:<tenant>|<model>`` ZSET request id -> TTFT deadline (ms): a tenant's queue
``wt:<model>``         SET tenants with requests queued for the model
``wl``                 ZSET request id -> lease expiry (ms) of queue places
``wr``                 HASH request id -> "tenant\\nweight\\nprompt\\nmodel"
``tw``                 HASH tenant -> weight, as last seen (the plans' shares)
``ad:<model>``         LIST the model's recent admission times (ms), newest first
``s:<backend>``        ZSET request id -> lease expiry (ms): the backend's slots, one per
                       request it serves (a failover moves it)
``r|t:<tenant>:<min>`` STRING requests / tokens in a one-minute window
``b:<tenant>:<end>``   STRING tokens used in the budget period ending at ``end``
``x<name>:<t>:<min>``  STRING other per-minute counters (telemetry reports)
``req:<id>``           HASH tenant, tier, ttft, tds, model[, reported] (with a TTL)
``keys``, ``revoked``  HASH digest -> tenant; SET revoked digests
``keyver``             STRING bumped on every change of ``keys`` or ``revoked``
``epoch``              STRING a random id set once per store: changes (or goes) when the
                       store lost its data (docs/architecture/gateway.md, "API keys")
``tenants``            HASH tenant -> description (JSON)
``tel``                STREAM QoE records (trimmed by age and length)
``qa:<size>:<start>:<tenant>``  HASH a tenant's QoE aggregates in one time bucket
                       (:mod:`gateway.store.aggregates`; expire with their level)
``qat``                SET tenants with QoE aggregates
=====================  ==========================================================

Connections: at most ``max_connections`` calls hold one at a time; a call that finds
none free waits up to ``timeout_s`` for one, then is refused as busy
(:class:`~gateway.store.base.StoreBusy`), which is not an outage. Both waits count the
store's time, not the gateway's event loop lagging under load
(:class:`~gateway.store.deadline.StoreDeadline`; at most :data:`HARD_TIMEOUTS` times
``timeout_s`` in all). Every call is one round trip (a command, a pipeline or a
script), counted by the store's monitor.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from importlib import resources
from typing import Any, TypeVar, cast, get_args

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError
from redis.typing import EncodableT, FieldT

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
    Status,
    Store,
    StoreBusy,
    StoreMonitor,
)
from gateway.store.deadline import LoopLag, StoreDeadline
from gateway.store.pubsub import ChannelListener
from gateway.store.queue import ADMISSION_HORIZON_S, ADMISSIONS_KEPT
from gateway.store.ratelimit import RateState
from qos.fairness import W_OUTPUT, W_PROMPT

log = logging.getLogger("tokenpace.gateway.store")
T = TypeVar("T")

_STATUSES = frozenset(get_args(Status))
_LUA = resources.files("gateway.store") / "lua"
_PRELUDE = (_LUA / "prelude.lua").read_text()  # the helpers every admission script uses


def _lua(name: str, *, prelude: bool = False) -> str:
    """The script in ``lua/<name>.lua`` (after the prelude: ``P`` is ARGV[1])."""
    body = (_LUA / f"{name}.lua").read_text()
    return _PRELUDE + body if prelude else body


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _status(value: str) -> Status:
    if value not in _STATUSES:
        raise ValueError(f"the admission script answered {value!r}")
    return cast(Status, value)


def _slot_args(slots: Sequence[Slot]) -> list[Any]:
    out: list[Any] = []
    for s in slots:
        out += [s.backend, s.capacity, int(s.candidate)]
    return out


_HORIZON_MS = int(ADMISSION_HORIZON_S * 1000)
HARD_TIMEOUTS = 10  # a store call's bound while the loop lags, in store timeouts


def _rate(r: list[Any]) -> RateState:
    return RateState(int(r[5]), int(r[6]), float(_s(r[7])), int(r[8]), int(r[9]), float(_s(r[10])))


def _aggregate_args(sums: Mapping[str, float], maxima: Mapping[str, float]) -> list[Any]:
    args: list[Any] = [len(sums)]
    for name, value in sums.items():
        args += [name, repr(value)]
    args.append(len(maxima))
    for name, value in maxima.items():
        args += [name, repr(value)]
    return args


class RedisStore(Store):
    """The store shared by every replica (see the module docstring)."""

    def __init__(
        self,
        url: str,
        prefix: str = "tokenpace",
        *,
        timeout_s: float = 0.5,
        request_ttl_s: int = 7 * 86400,
        retention_s: int = 7 * 86400,
        max_records: int = 1_000_000,
        max_connections: int = 256,
        monitor: StoreMonitor | None = None,
    ) -> None:
        self.url = url
        self.p = "{" + prefix + "}:"
        self.timeout_s = timeout_s
        self.request_ttl_s = request_ttl_s
        self.retention_s = retention_s
        self.max_records = max_records
        self.max_connections = max_connections
        self.monitor = monitor or StoreMonitor()
        self.hard_timeout_s = timeout_s * HARD_TIMEOUTS
        self._lag = LoopLag()
        options: dict[str, Any] = {
            # the calls' deadline is the store's (_call); the socket's, a backstop
            "socket_timeout": self.hard_timeout_s,
            "socket_connect_timeout": self.hard_timeout_s,
            "retry_on_timeout": False,
            "health_check_interval": 0,
        }
        # Never more connections than calls let through (self._gate): the pool's own wait
        # is never reached, and it never raises MaxConnectionsError.
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=None, **options
        )
        self.redis: aioredis.Redis = aioredis.Redis(connection_pool=pool)
        # one connection of its own: is Redis there, whatever the pool is doing
        self._probe: aioredis.Redis = aioredis.from_url(url, max_connections=1, **options)
        self._gate = asyncio.Semaphore(max_connections)
        self.listeners: list[ChannelListener] = []
        self._in_use = 0
        r = self.redis
        self._arrive = r.register_script(_lua("arrive", prelude=True))
        self._retry = r.register_script(_lua("retry", prelude=True))
        self._standing = r.register_script(_lua("standing", prelude=True))
        self._leave = r.register_script(_lua("leave", prelude=True))
        self._move = r.register_script(_lua("move", prelude=True))
        self._renew = r.register_script(_lua("renew", prelude=True))
        self._charge = r.register_script(_lua("charge", prelude=True))
        self._merge = r.register_script(_lua("merge", prelude=True))
        self._hit = r.register_script(_lua("hit", prelude=True))
        self._add_qoe = r.register_script(_lua("add_qoe", prelude=True))
        self._seed = r.register_script(_lua("seed"))
        self._revoke = r.register_script(_lua("revoke"))
        self._add_key = r.register_script(_lua("add_key"))
        self._budgets = r.register_script(_lua("budgets", prelude=True))
        self._restore_budgets = r.register_script(_lua("restore_budgets", prelude=True))

    async def aclose(self) -> None:
        listeners, self.listeners = self.listeners, []
        for listener in listeners:
            await listener.aclose()
        await self.redis.aclose()
        await self._probe.aclose()

    async def _call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """One round trip: a connection within ``timeout_s`` (else StoreBusy), then the
        call within ``timeout_s`` (else TimeoutError, from the socket or from here)."""
        gate = self._gate
        if gate.locked():
            self.monitor.waited()
            try:
                async with StoreDeadline(self._lag, self.timeout_s, self.hard_timeout_s):
                    await gate.acquire()
            except TimeoutError:
                self.monitor.error("busy")
                raise StoreBusy(
                    f"no free Redis connection within {self.timeout_s} s "
                    f"({self.max_connections} in use)"
                ) from None
        else:
            await gate.acquire()
        self._in_use += 1
        self.monitor.pool(self._in_use, self.max_connections)
        try:
            self.monitor.redis_call()
            async with StoreDeadline(self._lag, self.timeout_s, self.hard_timeout_s):
                return await fn(*args, **kwargs)
        finally:
            self._in_use -= 1
            gate.release()
            self.monitor.pool(self._in_use, self.max_connections)

    async def ping(self) -> bool:
        return bool(await self._call(self.redis.ping))

    async def alive(self) -> bool:
        """Whether Redis answers a PING within ``timeout_s`` on a connection of its own
        (outside the pool: a full pool does not make Redis look down)."""
        try:
            async with StoreDeadline(self._lag, self.timeout_s, self.hard_timeout_s):
                return bool(await self._probe.ping())
        except Exception:
            return False

    async def reset(self) -> None:
        """Drop every connection (after an outage, before reconnecting)."""
        await self.redis.connection_pool.disconnect()
        await self._probe.connection_pool.disconnect()

    async def persistence(self) -> bool | None:
        """Whether Redis writes an append-only file (None: it will not say, e.g. CONFIG is
        disabled on a managed Redis)."""
        try:
            conf: Mapping[Any, Any] = await self._call(self.redis.config_get, "appendonly")
        except ResponseError:
            return None
        value = conf.get("appendonly") or conf.get(b"appendonly")
        return None if value is None else _s(value) == "yes"

    # -- keys -----------------------------------------------------------------------------
    async def seed_keys(self, keys: Mapping[str, str], tenants: Mapping[str, str]) -> None:
        await self.restore_keys(keys, ())
        if tenants:
            mapping: dict[FieldT, EncodableT] = {k: v for k, v in tenants.items()}
            await self._call(self.redis.hset, self.p + "tenants", mapping=mapping)

    async def restore_keys(self, keys: Mapping[str, str], revoked: Iterable[str]) -> int:
        """Write ``revoked`` (for good) and ``keys`` (unless revoked); returns the changes."""
        gone = list(revoked)
        args: list[Any] = [self.p, len(gone), *gone]
        for digest, tenant in keys.items():
            args += [digest, tenant]
        return int(await self._call(self._seed, args=args))

    async def key_state(self) -> tuple[str | None, int]:
        """(the store's epoch or None, the key table's version): one round trip."""
        epoch, version = await self._call(
            lambda: self.redis.mget(self.p + "epoch", self.p + "keyver")
        )
        return (_s(epoch) if epoch is not None else None), int(version or 0)

    async def ensure_epoch(self, new: str) -> str:
        """The store's epoch, set to ``new`` if it has none (one round trip)."""
        pipe: Pipeline = self.redis.pipeline(transaction=True)
        pipe.set(self.p + "epoch", new, nx=True)
        pipe.get(self.p + "epoch")
        return _s((await self._call(pipe.execute))[1])

    async def key_table(self) -> tuple[dict[str, str], set[str], int]:
        """Every live key (digest -> tenant), every revoked digest, the table's version."""
        pipe: Pipeline = self.redis.pipeline(transaction=True)
        pipe.hgetall(self.p + "keys")
        pipe.smembers(self.p + "revoked")
        pipe.get(self.p + "keyver")
        keys, revoked, version = await self._call(pipe.execute)
        return (
            {_s(d): _s(t) for d, t in keys.items()},
            {_s(d) for d in revoked},
            int(version or 0),
        )

    async def tenant_for_key(self, digest: str) -> str | None:
        v = await self._call(self.redis.hget, self.p + "keys", digest)
        return _s(v) if v is not None else None

    async def add_key(self, tenant: str, digest: str) -> None:
        if not await self._call(self._add_key, args=[self.p, tenant, digest]):
            raise ValueError("a revoked key cannot be added again")

    async def revoke_key(self, tenant: str, digest: str) -> bool:
        return bool(await self._call(self._revoke, args=[self.p, tenant, digest]))

    async def tenant_keys(self, tenant: str) -> list[str]:
        keys = await self._call(self.redis.hgetall, self.p + "keys")
        return sorted(_s(d) for d, t in keys.items() if _s(t) == tenant)

    # -- admission ------------------------------------------------------------------------
    async def arrive(self, req: Arrival, slots: Sequence[Slot], lease_s: float) -> Admission:
        lim = req.limits
        args = [
            self.p,
            req.request_id,
            req.tenant,
            repr(float(req.weight)),
            req.model,
            req.ttft_s * 1000,
            req.prompt_tokens,
            req.expected_tokens,
            W_PROMPT,
            lim.requests_per_minute,
            lim.tokens_per_minute,
            lim.token_budget,
            lim.budget_period_s,
            lim.max_queued,
            int(lease_s * 1000),
            self.request_ttl_s,
            req.tier,
            repr(float(req.ttft_s)),
            repr(float(req.tds)),
            ADMISSIONS_KEPT,
            _HORIZON_MS,
            lim.max_concurrent,
            *_slot_args(slots),
        ]
        r = await self._call(self._arrive, args=args)
        status = _s(r[0])
        backend = _s(r[1]) if status == "admitted" else None
        head = _s(r[1]) if status in ("queued", "full") and r[1] else None
        return Admission(
            _status(status),
            backend=backend,
            head=head,
            counter=float(_s(r[2])),
            retry_after_ms=float(_s(r[3])),
            limited_by=_s(r[4]) or None,
            rate=_rate(r),
            position=int(r[11]),
            wait_s=float(_s(r[12])),
        )

    async def retry(self, request_id: str, slots: Sequence[Slot], lease_s: float) -> Admission:
        lease_ms = int(lease_s * 1000)
        args: list[Any] = [self.p, request_id, W_PROMPT, lease_ms, ADMISSIONS_KEPT, _HORIZON_MS]
        args += _slot_args(slots)
        r = await self._call(self._retry, args=args)
        status = _s(r[0])
        return Admission(
            _status(status),
            backend=_s(r[1]) if status == "admitted" else None,
            head=_s(r[1]) if status in ("queued", "full") and r[1] else None,
            counter=float(_s(r[2])),
        )

    async def standing(
        self, model: str, request_ids: Sequence[str], slots: Sequence[Slot]
    ) -> Standing:
        args: list[Any] = [self.p, model, _HORIZON_MS, len(request_ids), *request_ids]
        args += _slot_args(slots)
        r = await self._call(self._standing, args=args)
        places = {_s(r[i]): int(r[i + 1]) for i in range(1, len(r), 2)}
        return Standing(places, float(_s(r[0])))

    async def leave(self, request_id: str) -> None:
        await self._call(self._leave, args=[self.p, request_id])

    async def move(self, request_id: str, source: str, target: Slot, lease_s: float) -> bool:
        lease_ms = int(lease_s * 1000)
        args: list[Any] = [self.p, request_id, source, target.backend, target.capacity, lease_ms]
        return bool(await self._call(self._move, args=args))

    async def release(self, request_id: str, backend: str) -> None:
        await self._call(self.redis.zrem, f"{self.p}s:{backend}", request_id)

    async def release_holder(self, tag: str, backends: Sequence[str]) -> int:
        """Drop the slots on ``backends`` and the queue places of every request id that
        begins with ``tag``, a holder known to be gone (:mod:`gateway.runtime.holders`),
        before their leases lapse; how many were dropped."""
        script = self.redis.register_script(_lua("release_holder", prelude=True))
        return int(await script(args=[self.p, tag, *backends]))

    async def renew(
        self, slots: Iterable[tuple[str, str]], waiting: Iterable[str], lease_s: float
    ) -> None:
        held = list(slots)
        args: list[Any] = [self.p, int(lease_s * 1000), len(held)]
        for backend, rid in held:
            args += [backend, rid]
        args += list(waiting)
        await self._call(self._renew, args=args)

    async def charge(self, usage: Mapping[str, tuple[float, int, int]]) -> dict[str, float]:
        if not usage:
            return {}
        args: list[Any] = [self.p, W_OUTPUT]
        for tenant, (weight, tokens, period_s) in usage.items():
            args += [tenant, repr(float(weight)), tokens, period_s]
        r = await self._call(self._charge, args=args)
        return {_s(r[i]): float(_s(r[i + 1])) for i in range(0, len(r), 2)}

    async def budgets(self, periods: Mapping[str, int]) -> dict[tuple[str, int], float]:
        """Tokens used per tenant in its current budget period: ``periods`` maps a tenant
        to its period's length (s); keys are (tenant, the period's end in ms)."""
        if not periods:
            return {}
        args: list[Any] = [self.p]
        for tenant, period_s in periods.items():
            args += [tenant, period_s]
        r = await self._call(self._budgets, args=args)
        return {
            (_s(r[i]), int(float(_s(r[i + 1])))): float(_s(r[i + 2])) for i in range(0, len(r), 3)
        }

    async def restore_budgets(self, used: Mapping[tuple[str, int], float]) -> int:
        """Raise each budget period still running to at least the tokens ``used`` in it
        (keys as :meth:`budgets` answers); how many were raised."""
        args: list[Any] = [self.p]
        for (tenant, period_end), tokens in used.items():
            args += [tenant, period_end, repr(float(tokens))]
        if len(args) == 1:
            return 0
        return int(await self._call(self._restore_budgets, args=args))

    async def counters(self) -> dict[str, float]:
        raw = await self._call(self.redis.hgetall, self.p + "vtc")
        return {_s(k): float(_s(v)) for k, v in raw.items()}

    async def merge_counters(self, counters: Mapping[str, float]) -> None:
        if not counters:
            return
        args: list[Any] = [self.p]
        for tenant, value in counters.items():
            args += [tenant, repr(float(value))]
        await self._call(self._merge, args=args)

    async def in_flight(self, backend: str) -> int:
        key = f"{self.p}s:{backend}"
        pipe: Pipeline = self.redis.pipeline(transaction=True)
        pipe.zremrangebyscore(key, "-inf", time.time() * 1000)
        pipe.zcard(key)
        return int((await self._call(pipe.execute))[1])

    async def hit(self, tenant: str, name: str, limit: int) -> tuple[bool, float]:
        wait = float(_s(await self._call(self._hit, args=[self.p, tenant, "x" + name, limit])))
        return wait == 0, wait

    async def count_request(self, tenant: str, limit: int) -> tuple[bool, float]:
        wait = float(_s(await self._call(self._hit, args=[self.p, tenant, "r", limit])))
        return wait == 0, wait

    # -- requests and telemetry -----------------------------------------------------------
    async def remember(self, request_id: str, info: RequestInfo) -> None:
        key = f"{self.p}req:{request_id}"
        pipe: Pipeline = self.redis.pipeline(transaction=True)
        pipe.hset(
            key,
            mapping={
                "tenant": info.tenant,
                "tier": info.tier,
                "ttft": repr(info.ttft),
                "tds": repr(info.tds),
                "model": info.model,
            },
        )
        pipe.expire(key, self.request_ttl_s)
        await self._call(pipe.execute)

    async def request_info(self, request_id: str) -> RequestInfo | None:
        raw = await self._call(self.redis.hgetall, f"{self.p}req:{request_id}")
        if not raw:
            return None
        f = {_s(k): _s(v) for k, v in raw.items()}
        return RequestInfo(
            f["tenant"], f["tier"], float(f["ttft"]), float(f["tds"]), f["model"], "reported" in f
        )

    def _qoe_args(self, records: Sequence[QoERecord], per_minute: int = 0) -> list[Any]:
        """The arguments of add_qoe.lua: client records each with their own aggregate
        (added only if stored), the gateway's together (always stored)."""
        args: list[Any] = [self.p, self.retention_s * 1000, self.max_records]
        kept = aggregates.keeps(self.retention_s)
        args.append(len(aggregates.LEVELS))
        for lvl, keep in zip(aggregates.LEVELS, kept, strict=True):
            args += [lvl.size_s, keep]
        args.append(len(records))
        for rec in records:
            fields = rec.fields()
            args += [per_minute if rec.side == "client" else 0, len(fields)]
            for k, v in fields.items():
                args += [k, v]
            own = aggregates.contributions([rec]) if rec.side == "client" else {}
            args += _aggregate_args(*own.get(rec.tenant, ({}, {})))
        together = aggregates.contributions(r for r in records if r.side == "gateway")
        args.append(len(together))
        for tenant, (sums, maxima) in together.items():
            args += [tenant, *_aggregate_args(sums, maxima)]
        return args

    async def add_qoe(self, records: Sequence[QoERecord]) -> list[ReportResult]:
        if not records:
            return []
        args = self._qoe_args(records)
        results = [_s(x) for x in await self._call(self._add_qoe, args=args)]
        for rec, result in zip(records, results, strict=True):
            if result == "invalid":  # cannot be made (QoERecord checks): a bug, said loudly
                log.error("QoE record of %s refused by the store as invalid", rec.request_id)
        return [cast(ReportResult, "unknown" if r == "invalid" else r) for r in results]

    async def add_report(self, record: QoERecord, per_minute: int) -> tuple[ReportResult, float]:
        args = self._qoe_args([record], per_minute)
        (result,) = [_s(x) for x in await self._call(self._add_qoe, args=args)]
        status, _, wait = result.partition(":")
        if status == "invalid":
            log.error("QoE report of %s refused by the store as invalid", record.request_id)
            return "unknown", 0.0
        return cast(ReportResult, status), float(wait or 0)

    async def qoe_records(self, since: float, tenant: str | None = None) -> list[QoERecord]:
        out: list[QoERecord] = []
        bad = 0
        start = str(int(since * 1000))
        while True:
            found = await self._call(self.redis.xrange, self.p + "tel", min=start, count=5000)
            batch = found or []
            for entry_id, raw in batch:
                f = {_s(k): _s(v) for k, v in (raw or {}).items()}
                if tenant is None or f.get("tenant") == tenant:
                    ts = int(_s(entry_id).partition("-")[0]) / 1000.0
                    try:
                        out.append(QoERecord.from_fields(f, ts))
                    except ValueError:
                        bad += 1
            if len(batch) < 5000:
                break
            start = "(" + _s(batch[-1][0])
        if bad:
            log.warning("%d QoE record(s) in Redis are not valid records: skipped", bad)
        return out

    async def qoe_window(self, window_s: float, tenant: str | None = None) -> QoEAggregates:
        first: Pipeline = self.redis.pipeline(transaction=False)
        first.time()
        if tenant is None:
            first.smembers(self.p + "qat")
        answer = await self._call(first.execute)
        seconds, micros = answer[0]
        tenants = [tenant] if tenant is not None else sorted(_s(t) for t in answer[1])
        plan = aggregates.plan(seconds + micros / 1e6, window_s, self.retention_s)
        read: Pipeline = self.redis.pipeline(transaction=False)
        for name in tenants:
            for level, start in plan:
                read.hgetall(f"{self.p}qa:{aggregates.bucket_key(level, start, name)}")
        rows = await self._call(read.execute) if tenants and plan else []
        out: QoEAggregates = {}
        bad = 0
        for i, row in enumerate(rows):
            if row:
                fields = {_s(k): _s(v) for k, v in row.items()}
                bad += aggregates.merge_into(out, tenants[i // len(plan)], fields)
        if bad:
            log.warning("%d QoE aggregate field(s) in Redis are not numbers: skipped", bad)
        return out

    async def shared_secret(self, name: str, candidate: str) -> str:
        key = self.p + "secret:" + name
        pipe: Pipeline = self.redis.pipeline(transaction=True)
        pipe.set(key, candidate, nx=True)
        pipe.get(key)
        return _s((await self._call(pipe.execute))[1])

    # -- messages ---------------------------------------------------------------------------
    async def publish(self, channel: str, message: bytes) -> None:
        await self._call(self.redis.publish, channel, message)

    def subscribe(self, channel: str, handler: Callable[[bytes], None]) -> None:
        self.listeners.append(ChannelListener(self.url, channel, handler))
