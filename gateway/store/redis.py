"""The shared store in Redis (redis-py asyncio): every read-modify-write one Lua script.

The scripts are the atomic form of :class:`qos.fairness.VirtualTokenCounter` (enqueue
with counter lift, dequeue, charge; ``w_p``/``w_q`` are passed in from
:mod:`qos.fairness`, never written here) and of :mod:`gateway.ratelimit`'s windows;
``tests/test_store.py`` checks them against the Python on the same events. Times are
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
``s:<backend>``        ZSET request id -> lease expiry (ms): the backend's slots
``r|t:<tenant>:<min>`` STRING requests / tokens in a one-minute window
``b:<tenant>:<end>``   STRING tokens used in the budget period ending at ``end``
``x<name>:<t>:<min>``  STRING other per-minute counters (telemetry reports)
``req:<id>``           HASH tenant, tier, ttft, tds, model[, reported] (with a TTL)
``keys``, ``revoked``  HASH digest -> tenant; SET revoked digests
``keyver``             STRING bumped on every change of ``keys`` or ``revoked``
``epoch``              STRING a random id set once per store: changes (or goes) when the
                       store lost its data (docs/architecture.md, "API keys")
``tenants``            HASH tenant -> description (JSON)
``tel``                STREAM QoE records (trimmed by age and length)
``agg``                HASH "tenant|tier|side|n|a|m" -> all-time count and sums
=====================  ==========================================================
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError

from gateway.ratelimit import WINDOW_MS, RateState
from gateway.store.base import (
    Admission,
    Arrival,
    QoERecord,
    ReportResult,
    RequestInfo,
    Slot,
    Store,
)
from qos.fairness import W_OUTPUT, W_PROMPT

# Helpers every admission script starts with. P (ARGV[1]) is the key prefix.
_PRELUDE = (
    """
local P = ARGV[1]
local function num(v) return tonumber(v) or 0 end
local function now_ms()  -- with microseconds: deadlines of close arrivals must differ
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end
local function fmt(x) return string.format('%.17g', x) end
local function parse(info)
  return string.match(info, '^([^\\n]*)\\n([^\\n]*)\\n([^\\n]*)\\n(.*)$')
end
-- VTC dequeue: a request leaves the queue (admitted, gone or lapsed)
local function drop_waiter(rid)
  redis.call('ZREM', P..'wl', rid)
  local info = redis.call('HGET', P..'wr', rid)
  if not info then return end
  redis.call('HDEL', P..'wr', rid)
  local tenant, _, _, model = parse(info)
  local wkey = P..'w:'..tenant..'|'..model
  redis.call('ZREM', wkey, rid)
  if redis.call('ZCARD', wkey) == 0 then redis.call('SREM', P..'wt:'..model, tenant) end
  if redis.call('HINCRBY', P..'wn', tenant, -1) <= 0 then
    redis.call('HDEL', P..'wn', tenant)
    redis.call('SET', P..'last', tenant)
  end
end
local function expire_waiters(now)
  for _, rid in ipairs(redis.call('ZRANGEBYSCORE', P..'wl', '-inf', now)) do drop_waiter(rid) end
end
-- VTC enqueue: lift an idle tenant to the least counter of the queued tenants, or to
-- the counter of the last tenant that left when nobody is queued
local function enqueue(tenant)
  if num(redis.call('HGET', P..'wn', tenant)) == 0 then
    local floor = nil
    local wn = redis.call('HGETALL', P..'wn')
    for i = 1, #wn, 2 do
      if tonumber(wn[i + 1]) > 0 then
        local c = num(redis.call('HGET', P..'vtc', wn[i]))
        if floor == nil or c < floor then floor = c end
      end
    end
    if floor == nil then
      local last = redis.call('GET', P..'last')
      floor = last and num(redis.call('HGET', P..'vtc', last)) or 0
    end
    if floor > num(redis.call('HGET', P..'vtc', tenant)) then
      redis.call('HSET', P..'vtc', tenant, fmt(floor))
    end
  end
  redis.call('HINCRBY', P..'wn', tenant, 1)
end
-- the head of a model's queue: least counter, then earliest deadline, then id
local function head(model)
  local best, bc, bd = nil, 0, 0
  for _, t in ipairs(redis.call('SMEMBERS', P..'wt:'..model)) do
    local first = redis.call('ZRANGE', P..'w:'..t..'|'..model, 0, 0, 'WITHSCORES')
    if #first > 0 then
      local c, d = num(redis.call('HGET', P..'vtc', t)), tonumber(first[2])
      if best == nil or c < bc or (c == bc and (d < bd or (d == bd and first[1] < best))) then
        best, bc, bd = first[1], c, d
      end
    end
  end
  return best
end
-- admit rid if it is the head and a slot is free; slots are ARGV[first..] pairs
local function try_admit(rid, now, lease_ms, wp, first)
  local info = redis.call('HGET', P..'wr', rid)
  if not info then return {'gone', '', '0'} end
  local tenant, weight, prompt, model = parse(info)
  local h = head(model)
  local counter = num(redis.call('HGET', P..'vtc', tenant))
  if h ~= rid then return {'queued', h or '', fmt(counter)} end
  for i = first, #ARGV, 2 do
    local skey, cap = P..'s:'..ARGV[i], tonumber(ARGV[i + 1])
    redis.call('ZREMRANGEBYSCORE', skey, '-inf', now)
    if cap <= 0 or redis.call('ZCARD', skey) < cap then
      redis.call('ZADD', skey, now + lease_ms, rid)
      drop_waiter(rid)
      local c = redis.call('HINCRBYFLOAT', P..'vtc', tenant,
        wp * tonumber(prompt) / tonumber(weight))
      return {'admitted', ARGV[i], c}
    end
  end
  return {'full', rid, fmt(counter)}
end
local W = """
    + str(WINDOW_MS)
    + """
local function window(kind, tenant, idx)
  local base = P..kind..':'..tenant..':'
  return num(redis.call('GET', base..(idx - 1))), num(redis.call('GET', base..idx))
end
local function bump(kind, tenant, idx, n)
  local key = P..kind..':'..tenant..':'..idx
  redis.call('INCRBYFLOAT', key, n)
  redis.call('PEXPIRE', key, 3 * W)
end
-- gateway.ratelimit.wait_ms
local function wait_ms(limit, cost, prev, cur, frac)
  if prev * (1 - frac) + cur + cost <= limit then return 0 end
  if cost > limit then return -1 end
  if prev > 0 and cur + cost <= limit then
    local f = 1 - (limit - cost - cur) / prev
    return math.ceil(math.max(0, f - frac) * W)
  end
  local f2 = 0
  if cur > 0 then f2 = math.max(0, 1 - (limit - cost) / cur) end
  return math.ceil((1 - frac + f2) * W)
end
-- gateway.ratelimit.reset_ms
local function reset_ms(prev, cur, frac)
  if cur > 0 then return math.ceil((2 - frac) * W) end
  if prev > 0 then return math.ceil((1 - frac) * W) end
  return 0
end
"""
)

# ARGV: P, rid, tenant, weight, model, ttft_ms, prompt, expected, wp, rpm, tpm, budget,
# budget_period_s, max_queued, lease_ms, request ttl s, tier, ttft, tds, slot pairs...
_ARRIVE = (
    _PRELUDE
    + """
local rid, tenant, weight, model = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local ttft_ms, prompt, expected = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local wp, rpm, tpm = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local budget, period_s, max_queued = tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14])
local lease_ms, ttl = tonumber(ARGV[15]), tonumber(ARGV[16])
local now = now_ms()
expire_waiters(now)
local idx = math.floor(now / W)
local frac = (now - idx * W) / W
local rate = {0, 0, 0, 0, 0, 0}
local function answer(status, a, b, retry, by)
  return {status, a, b, tostring(retry), by, rate[1], rate[2], tostring(rate[3]),
    rate[4], rate[5], tostring(rate[6])}
end
if rpm > 0 or tpm > 0 then
  local rp, rc = window('r', tenant, idx)
  local tp, tc = window('t', tenant, idx)
  rate = {rpm, math.floor(rpm - (rp * (1 - frac) + rc) - 1), reset_ms(rp, rc + 1, frac),
    tpm, math.floor(tpm - (tp * (1 - frac) + tc) - prompt), reset_ms(tp, tc + prompt, frac)}
  if rpm > 0 then
    local wait = wait_ms(rpm, 1, rp, rc, frac)
    if wait ~= 0 then return answer('limited', '', '0', wait, 'requests') end
  end
  if tpm > 0 then
    local wait = wait_ms(tpm, prompt + expected, tp, tc, frac)
    if wait ~= 0 then return answer('limited', '', '0', wait, 'tokens') end
  end
end
local period_end = 0
if budget > 0 then
  local period_ms = period_s * 1000
  period_end = (math.floor(now / period_ms) + 1) * period_ms
  local used = num(redis.call('GET', P..'b:'..tenant..':'..period_end))
  if used + prompt > budget then
    return answer('limited', '', '0', period_end - now, 'budget')
  end
end
if max_queued > 0 and num(redis.call('HGET', P..'wn', tenant)) >= max_queued then
  return answer('queue_full', '', '0', 1000, '')
end
bump('r', tenant, idx, 1)
bump('t', tenant, idx, prompt)
if period_end > 0 then
  local key = P..'b:'..tenant..':'..period_end
  redis.call('INCRBYFLOAT', key, prompt)
  redis.call('PEXPIREAT', key, period_end + W)
end
local rkey = P..'req:'..rid
redis.call('HSET', rkey, 'tenant', tenant, 'tier', ARGV[17], 'ttft', ARGV[18],
  'tds', ARGV[19], 'model', model)
redis.call('EXPIRE', rkey, ttl)
enqueue(tenant)
redis.call('ZADD', P..'w:'..tenant..'|'..model, now + ttft_ms, rid)
redis.call('SADD', P..'wt:'..model, tenant)
redis.call('ZADD', P..'wl', now + lease_ms, rid)
redis.call('HSET', P..'wr', rid, tenant..'\\n'..weight..'\\n'..prompt..'\\n'..model)
local r = try_admit(rid, now, lease_ms, wp, 20)
return answer(r[1], r[2], r[3], 0, '')
"""
)

# ARGV: P, rid, wp, lease_ms, slot pairs...
_RETRY = (
    _PRELUDE
    + """
local rid, wp, lease_ms = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
expire_waiters(now)
if redis.call('ZSCORE', P..'wl', rid) then redis.call('ZADD', P..'wl', now + lease_ms, rid) end
return try_admit(rid, now, lease_ms, wp, 5)
"""
)

# ARGV: P, rid
_LEAVE = _PRELUDE + "drop_waiter(ARGV[2])\nreturn 1\n"

# ARGV: P, lease_ms, n_slots, (backend, rid)*n_slots, waiting rids...
_RENEW = (
    _PRELUDE
    + """
local now = now_ms()
local until_ms = now + tonumber(ARGV[2])
local n = tonumber(ARGV[3])
for i = 0, n - 1 do
  redis.call('ZADD', P..'s:'..ARGV[4 + 2 * i], until_ms, ARGV[5 + 2 * i])
end
for i = 4 + 2 * n, #ARGV do redis.call('ZADD', P..'wl', 'XX', until_ms, ARGV[i]) end
return 1
"""
)

# ARGV: P, wq, (tenant, weight, tokens, budget_period_s)*
_CHARGE = (
    _PRELUDE
    + """
local wq = tonumber(ARGV[2])
local now = now_ms()
local idx = math.floor(now / W)
local out = {}
for i = 3, #ARGV, 4 do
  local tenant, weight, tokens = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local period_ms = tonumber(ARGV[i + 3]) * 1000
  out[#out + 1] = tenant
  out[#out + 1] = redis.call('HINCRBYFLOAT', P..'vtc', tenant, wq * tokens / weight)
  bump('t', tenant, idx, tokens)
  local period_end = (math.floor(now / period_ms) + 1) * period_ms
  local key = P..'b:'..tenant..':'..period_end
  redis.call('INCRBYFLOAT', key, tokens)
  redis.call('PEXPIREAT', key, period_end + W)
end
return out
"""
)

# ARGV: P, (tenant, counter)*
_MERGE = (
    _PRELUDE
    + """
for i = 2, #ARGV, 2 do
  if tonumber(ARGV[i + 1]) > num(redis.call('HGET', P..'vtc', ARGV[i])) then
    redis.call('HSET', P..'vtc', ARGV[i], ARGV[i + 1])
  end
end
return 1
"""
)

# ARGV: P, tenant, name, limit
_HIT = (
    _PRELUDE
    + """
local now = now_ms()
local idx = math.floor(now / W)
local frac = (now - idx * W) / W
local kind = 'x'..ARGV[3]
local prev, cur = window(kind, ARGV[2], idx)
local wait = wait_ms(tonumber(ARGV[4]), 1, prev, cur, frac)
if wait ~= 0 then return tostring(wait) end
bump(kind, ARGV[2], idx, 1)
return '0'
"""
)

# ARGV: P, retention_ms, max_records, then per record: n_fields, field, value, ...
# A client record must name a request of its tenant that has not been reported yet.
_ADD_QOE = """
local P = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local minid = tostring(math.max(0, now - tonumber(ARGV[2])))
local out = {}
local i = 4
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local f = {}
  for j = i + 1, i + 2 * n, 2 do f[ARGV[j]] = ARGV[j + 1] end
  local ok = 'ok'
  if f.side == 'client' then
    local rkey = P..'req:'..f.rid
    if redis.call('HGET', rkey, 'tenant') ~= f.tenant then
      ok = 'unknown'
    elseif redis.call('HSETNX', rkey, 'reported', '1') == 0 then
      ok = 'duplicate'
    end
  end
  if ok == 'ok' then
    redis.call('XADD', P..'tel', 'MINID', '~', minid, '*', unpack(ARGV, i + 1, i + 2 * n))
    local g = f.tenant..'|'..f.tier..'|'..f.side..'|'
    redis.call('HINCRBY', P..'agg', g..'n', 1)
    redis.call('HINCRBYFLOAT', P..'agg', g..'a', f.andes)
    redis.call('HINCRBYFLOAT', P..'agg', g..'m', f.monotone)
  end
  out[#out + 1] = ok
  i = i + 1 + 2 * n
end
redis.call('XTRIM', P..'tel', 'MAXLEN', '~', tonumber(ARGV[3]))
return out
"""

# ARGV: P, n, revoked digest * n, (digest, tenant)* ; KEYS none. Revocations first and
# for good; then keys, unless revoked. Seeding the configured keys is the case n = 0; a
# replica restoring a store that lost its data passes its whole key table.
_SEED = """
local P = ARGV[1]
local n = tonumber(ARGV[2])
local changed = 0
for i = 3, 2 + n do
  changed = changed + redis.call('SADD', P..'revoked', ARGV[i])
  changed = changed + redis.call('HDEL', P..'keys', ARGV[i])
end
for i = 3 + n, #ARGV, 2 do
  if redis.call('SISMEMBER', P..'revoked', ARGV[i]) == 0 then
    changed = changed + redis.call('HSET', P..'keys', ARGV[i], ARGV[i + 1])
  end
end
if changed > 0 then redis.call('INCR', P..'keyver') end
return changed
"""

# ARGV: P, tenant, digest
_REVOKE = """
local P = ARGV[1]
if redis.call('HGET', P..'keys', ARGV[3]) ~= ARGV[2] then return 0 end
redis.call('HDEL', P..'keys', ARGV[3])
redis.call('SADD', P..'revoked', ARGV[3])
redis.call('INCR', P..'keyver')
return 1
"""

_ADD_KEY = """
local P = ARGV[1]
if redis.call('SISMEMBER', P..'revoked', ARGV[3]) == 1 then return 0 end
redis.call('HSET', P..'keys', ARGV[3], ARGV[2])
redis.call('INCR', P..'keyver')
return 1
"""


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _slot_args(slots: Sequence[Slot]) -> list[Any]:
    out: list[Any] = []
    for s in slots:
        out += [s.backend, s.capacity]
    return out


def _rate(r: list[Any]) -> RateState:
    return RateState(int(r[5]), int(r[6]), float(_s(r[7])), int(r[8]), int(r[9]), float(_s(r[10])))


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
    ) -> None:
        self.url = url
        self.p = "{" + prefix + "}:"
        self.request_ttl_s = request_ttl_s
        self.retention_s = retention_s
        self.max_records = max_records
        self.redis: aioredis.Redis = aioredis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry_on_timeout=False,
            health_check_interval=0,
            max_connections=64,
        )
        r = self.redis
        self._arrive = r.register_script(_ARRIVE)
        self._retry = r.register_script(_RETRY)
        self._leave = r.register_script(_LEAVE)
        self._renew = r.register_script(_RENEW)
        self._charge = r.register_script(_CHARGE)
        self._merge = r.register_script(_MERGE)
        self._hit = r.register_script(_HIT)
        self._add_qoe = r.register_script(_ADD_QOE)
        self._seed = r.register_script(_SEED)
        self._revoke = r.register_script(_REVOKE)
        self._add_key = r.register_script(_ADD_KEY)

    async def aclose(self) -> None:
        await self.redis.aclose()

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    async def persistence(self) -> bool | None:
        """Whether Redis writes an append-only file (None: it will not say, e.g. CONFIG is
        disabled on a managed Redis)."""
        try:
            conf = await self.redis.config_get("appendonly")
        except ResponseError:
            return None
        value = conf.get("appendonly") or conf.get(b"appendonly")
        return None if value is None else _s(value) == "yes"

    # -- keys -----------------------------------------------------------------------------
    async def seed_keys(self, keys: Mapping[str, str], tenants: Mapping[str, str]) -> None:
        await self.restore_keys(keys, ())
        if tenants:
            await self.redis.hset(self.p + "tenants", mapping=dict(tenants))

    async def restore_keys(self, keys: Mapping[str, str], revoked: Iterable[str]) -> int:
        """Write ``revoked`` (for good) and ``keys`` (unless revoked); returns the changes."""
        gone = list(revoked)
        args: list[Any] = [self.p, len(gone), *gone]
        for digest, tenant in keys.items():
            args += [digest, tenant]
        return int(await self._seed(args=args))

    async def key_state(self) -> tuple[str | None, int]:
        """(the store's epoch or None, the key table's version): one round trip."""
        epoch, version = await self.redis.mget(self.p + "epoch", self.p + "keyver")
        return (_s(epoch) if epoch is not None else None), int(version or 0)

    async def ensure_epoch(self, new: str) -> str:
        """The store's epoch, set to ``new`` if it has none."""
        await self.redis.set(self.p + "epoch", new, nx=True)
        return _s(await self.redis.get(self.p + "epoch"))

    async def key_table(self) -> tuple[dict[str, str], set[str], int]:
        """Every live key (digest -> tenant), every revoked digest, the table's version."""
        pipe: Pipeline = self.redis.pipeline(transaction=True)
        pipe.hgetall(self.p + "keys")
        pipe.smembers(self.p + "revoked")
        pipe.get(self.p + "keyver")
        keys, revoked, version = await pipe.execute()
        return (
            {_s(d): _s(t) for d, t in keys.items()},
            {_s(d) for d in revoked},
            int(version or 0),
        )

    async def tenant_for_key(self, digest: str) -> str | None:
        v = await self.redis.hget(self.p + "keys", digest)
        return _s(v) if v is not None else None

    async def add_key(self, tenant: str, digest: str) -> None:
        if not await self._add_key(args=[self.p, tenant, digest]):
            raise ValueError("a revoked key cannot be added again")

    async def revoke_key(self, tenant: str, digest: str) -> bool:
        return bool(await self._revoke(args=[self.p, tenant, digest]))

    async def tenant_keys(self, tenant: str) -> list[str]:
        keys = await self.redis.hgetall(self.p + "keys")
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
            *_slot_args(slots),
        ]
        r = await self._arrive(args=args)
        status = _s(r[0])
        backend = _s(r[1]) if status == "admitted" else None
        head = _s(r[1]) if status in ("queued", "full") and r[1] else None
        return Admission(
            status,  # type: ignore[arg-type]
            backend=backend,
            head=head,
            counter=float(_s(r[2])),
            retry_after_ms=float(_s(r[3])),
            limited_by=_s(r[4]) or None,
            rate=_rate(r),
        )

    async def retry(self, request_id: str, slots: Sequence[Slot], lease_s: float) -> Admission:
        args = [self.p, request_id, W_PROMPT, int(lease_s * 1000), *_slot_args(slots)]
        r = await self._retry(args=args)
        status = _s(r[0])
        return Admission(
            status,  # type: ignore[arg-type]
            backend=_s(r[1]) if status == "admitted" else None,
            head=_s(r[1]) if status in ("queued", "full") and r[1] else None,
            counter=float(_s(r[2])),
        )

    async def leave(self, request_id: str) -> None:
        await self._leave(args=[self.p, request_id])

    async def release(self, request_id: str, backend: str) -> None:
        await self.redis.zrem(f"{self.p}s:{backend}", request_id)

    async def renew(
        self, slots: Iterable[tuple[str, str]], waiting: Iterable[str], lease_s: float
    ) -> None:
        held = list(slots)
        args: list[Any] = [self.p, int(lease_s * 1000), len(held)]
        for backend, rid in held:
            args += [backend, rid]
        args += list(waiting)
        await self._renew(args=args)

    async def charge(self, usage: Mapping[str, tuple[float, int, int]]) -> dict[str, float]:
        if not usage:
            return {}
        args: list[Any] = [self.p, W_OUTPUT]
        for tenant, (weight, tokens, period_s) in usage.items():
            args += [tenant, repr(float(weight)), tokens, period_s]
        r = await self._charge(args=args)
        return {_s(r[i]): float(_s(r[i + 1])) for i in range(0, len(r), 2)}

    async def counters(self) -> dict[str, float]:
        raw = await self.redis.hgetall(self.p + "vtc")
        return {_s(k): float(_s(v)) for k, v in raw.items()}

    async def merge_counters(self, counters: Mapping[str, float]) -> None:
        if not counters:
            return
        args: list[Any] = [self.p]
        for tenant, value in counters.items():
            args += [tenant, repr(float(value))]
        await self._merge(args=args)

    async def in_flight(self, backend: str) -> int:
        key = f"{self.p}s:{backend}"
        pipe: Pipeline = self.redis.pipeline(transaction=True)
        pipe.zremrangebyscore(key, "-inf", time.time() * 1000)
        pipe.zcard(key)
        return int((await pipe.execute())[1])

    async def hit(self, tenant: str, name: str, limit: int) -> tuple[bool, float]:
        wait = float(_s(await self._hit(args=[self.p, tenant, name, limit])))
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
        await pipe.execute()

    async def request_info(self, request_id: str) -> RequestInfo | None:
        raw = await self.redis.hgetall(f"{self.p}req:{request_id}")
        if not raw:
            return None
        f = {_s(k): _s(v) for k, v in raw.items()}
        return RequestInfo(f["tenant"], f["tier"], float(f["ttft"]), float(f["tds"]), f["model"])

    async def add_qoe(self, records: Sequence[QoERecord]) -> list[ReportResult]:
        if not records:
            return []
        args: list[Any] = [self.p, self.retention_s * 1000, self.max_records]
        for rec in records:
            fields = rec.fields()
            args.append(len(fields))
            for k, v in fields.items():
                args += [k, v]
        return [_s(x) for x in await self._add_qoe(args=args)]  # type: ignore[misc]

    async def qoe_records(self, since: float, tenant: str | None = None) -> list[QoERecord]:
        out: list[QoERecord] = []
        start = str(int(since * 1000))
        while True:
            batch = await self.redis.xrange(self.p + "tel", min=start, count=5000)
            for entry_id, raw in batch:
                f = {_s(k): _s(v) for k, v in raw.items()}
                if tenant is None or f.get("tenant") == tenant:
                    ts = int(_s(entry_id).partition("-")[0]) / 1000.0
                    out.append(QoERecord.from_fields(f, ts))
            if len(batch) < 5000:
                return out
            start = "(" + _s(batch[-1][0])

    async def qoe_totals(self) -> dict[tuple[str, str, str], tuple[int, float, float]]:
        raw = await self.redis.hgetall(self.p + "agg")
        acc: dict[tuple[str, str, str], list[float]] = {}
        for k, v in raw.items():
            tenant, tier, side, what = _s(k).split("|")
            slot = acc.setdefault((tenant, tier, side), [0, 0.0, 0.0])
            slot[{"n": 0, "a": 1, "m": 2}[what]] = float(_s(v))
        return {k: (int(v[0]), v[1], v[2]) for k, v in acc.items()}

    async def shared_secret(self, name: str, candidate: str) -> str:
        key = self.p + "secret:" + name
        await self.redis.set(key, candidate, nx=True)
        return _s(await self.redis.get(key))
