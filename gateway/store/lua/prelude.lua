local P = ARGV[1]
local function num(v) return tonumber(v) or 0 end
local function now_ms()  -- with microseconds: deadlines of close arrivals must differ
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end
local function fmt(x) return string.format('%.17g', x) end
-- Every script checks its numbers before its first write: an error leaves nothing half
-- done (Redis does not roll a script back).
local function finite(v)
  local x = tonumber(v)
  if x == nil or x ~= x or x == math.huge or x == -math.huge then return nil end
  return x
end
local function require_numbers(first, last, step)
  for i = first, last, step or 1 do
    if finite(ARGV[i]) == nil then error('argument '..i..' is not a finite number') end
  end
end
local function parse(info)
  return string.match(info, '^([^\n]*)\n([^\n]*)\n([^\n]*)\n(.*)$')
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
-- qos.fairness.water_fill, in the same arithmetic: weighted max-min split of total
local function water_fill(asked, weights, total)
  local share, open = {}, {}
  for i = 1, #asked do share[i], open[i] = 0.0, asked[i] > 0 end
  local left = total
  while left > 1e-12 do
    local weight, any_open = 0, false
    for i = 1, #asked do
      if open[i] then weight, any_open = weight + weights[i], true end
    end
    if not any_open then break end
    local offer, capped, any_capped = {}, {}, false
    for i = 1, #asked do
      offer[i] = open[i] and left * weights[i] / weight or 0.0
      capped[i] = open[i] and share[i] + offer[i] >= asked[i]
      any_capped = any_capped or capped[i]
    end
    if not any_capped then
      for i = 1, #asked do share[i] = share[i] + offer[i] end
      return share
    end
    for i = 1, #asked do
      if capped[i] then
        left = left - (asked[i] - share[i])
        share[i], open[i] = asked[i], false
      end
    end
  end
  return share
end
-- the model's backends, ARGV triples (backend, cap, candidate 1/0) from index first
local function slot_list(first)
  local out = {}
  for i = first, #ARGV, 3 do
    out[#out + 1] = {ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2] == '1'}
  end
  return out
end
-- gateway.store.queue.admission_order's view of a model's queue: the tenants queued
-- (sorted), their counters, weights and caps (0: none), and, when the plans order it or
-- a cap applies, their holds; when the plans order it, their shares. With fewer than two
-- tenants queued the order is theirs by deadline either way.
local function queue_view(model, slots, now)
  local v = {tenants = redis.call('SMEMBERS', P..'wt:'..model), c = {}, w = {}, hold = {},
    share = {}, cap = {}, plans = false}
  table.sort(v.tenants)
  local function weight(t)
    if v.w[t] == nil then v.w[t] = tonumber(redis.call('HGET', P..'tw', t)) or 1 end
    return v.w[t]
  end
  local capped = false
  for _, t in ipairs(v.tenants) do
    v.c[t] = num(redis.call('HGET', P..'vtc', t))
    v.cap[t] = num(redis.call('HGET', P..'tc', t..'|'..model))
    capped = capped or v.cap[t] > 0
  end
  local capacity = 0
  for _, s in ipairs(slots) do
    if s[2] <= 0 then capacity = nil; break end  -- a backend without a cap: no plans
    capacity = capacity + s[2]
  end
  local plans = capacity ~= nil and #v.tenants >= 2
  if not plans and not capped then return v end
  for _, s in ipairs(slots) do
    local skey = P..'s:'..s[1]
    redis.call('ZREMRANGEBYSCORE', skey, '-inf', now)
    for _, rid in ipairs(redis.call('ZRANGE', skey, 0, -1)) do
      local t = redis.call('HGET', P..'req:'..rid, 'tenant')
      if t then v.hold[t] = (v.hold[t] or 0) + 1 end
    end
  end
  if not plans then return v end
  local seen, present = {}, {}
  for _, t in ipairs(v.tenants) do seen[t] = true; present[#present + 1] = t end
  for t, _ in pairs(v.hold) do
    if not seen[t] then present[#present + 1] = t end
  end
  table.sort(present)
  local wants, weights, lo, hi = {}, {}, nil, nil
  for i, t in ipairs(present) do
    wants[i] = (v.hold[t] or 0) + redis.call('ZCARD', P..'w:'..t..'|'..model)
    weights[i] = weight(t)
    lo = (lo == nil or weights[i] < lo) and weights[i] or lo
    hi = (hi == nil or weights[i] > hi) and weights[i] or hi
  end
  if lo == hi then return v end
  v.plans = true
  local split = water_fill(wants, weights, capacity)
  for i, t in ipairs(present) do v.share[t] = split[i] end
  return v
end
-- the sort key of tenant t's k-th queued request (deadline d, id rid)
local function order_key(v, t, k, d, rid)
  if not v.plans then return {0, 0, v.c[t], d, rid} end
  if (v.hold[t] or 0) + k <= v.share[t] + 1e-9 then return {0, 0, 0, d, rid} end
  return {1, -v.w[t], v.c[t], d, rid}
end
local function before(a, b)
  for i = 1, 5 do
    if a[i] ~= b[i] then return a[i] < b[i] end
  end
  return false
end
-- gateway.store.queue.at_cap
local function at_cap(v, t)
  return v.cap[t] > 0 and (v.hold[t] or 0) >= v.cap[t]
end
-- the head of a model's queue: the least key among the first requests of the tenants
-- below their cap (each tenant's keys grow along its queue; gateway.store.queue.capped_last)
local function head(v, model)
  local best = nil
  for _, t in ipairs(v.tenants) do
    local first = redis.call('ZRANGE', P..'w:'..t..'|'..model, 0, 0, 'WITHSCORES')
    if #first > 0 and not at_cap(v, t) then
      local key = order_key(v, t, 1, tonumber(first[2]), first[1])
      if best == nil or before(key, best) then best = key end
    end
  end
  return best and best[5]
end
-- every request queued for the model, in admission order, those of the tenants at their
-- cap last (gateway.store.queue.capped_last)
local function queue_order(v, model)
  local free, capped = {}, {}
  for _, t in ipairs(v.tenants) do
    local keys = at_cap(v, t) and capped or free
    local q = redis.call('ZRANGE', P..'w:'..t..'|'..model, 0, -1, 'WITHSCORES')
    for i = 1, #q, 2 do keys[#keys + 1] = order_key(v, t, (i + 1) / 2, tonumber(q[i + 1]), q[i]) end
  end
  table.sort(free, before)
  table.sort(capped, before)
  local out = {}
  for _, key in ipairs(free) do out[#out + 1] = key[5] end
  for _, key in ipairs(capped) do out[#out + 1] = key[5] end
  return out
end
-- gateway.store.queue.admission_interval over the model's recent admissions (ms)
local function admission_interval(model, now, horizon_ms)
  local n, oldest = 0, nil
  for _, t in ipairs(redis.call('LRANGE', P..'ad:'..model, 0, -1)) do
    t = tonumber(t)
    if t > now - horizon_ms then
      n = n + 1
      if oldest == nil or t < oldest then oldest = t end
    end
  end
  if n == 0 then return horizon_ms / 1000 end
  return (now - oldest) / 1000 / n
end
-- admit rid if it is the head and a candidate backend has a free slot; kept: how many
-- admission times the model's log keeps, horizon_ms: for how long. Also returns the
-- queue's view (before the admission).
local function try_admit(rid, now, lease_ms, wp, slots, kept, horizon_ms)
  local info = redis.call('HGET', P..'wr', rid)
  if not info then return {'gone', '', '0'} end
  local tenant, weight, prompt, model = parse(info)
  local v = queue_view(model, slots, now)
  local h = head(v, model)
  local counter = num(redis.call('HGET', P..'vtc', tenant))
  if h ~= rid then return {'queued', h or '', fmt(counter)}, v end
  for _, s in ipairs(slots) do
    local skey, cap = P..'s:'..s[1], s[2]
    redis.call('ZREMRANGEBYSCORE', skey, '-inf', now)
    if s[3] and (cap <= 0 or redis.call('ZCARD', skey) < cap) then
      redis.call('ZADD', skey, now + lease_ms, rid)
      drop_waiter(rid)
      local c = redis.call('HINCRBYFLOAT', P..'vtc', tenant,
        wp * tonumber(prompt) / tonumber(weight))
      local log = P..'ad:'..model
      redis.call('LPUSH', log, fmt(now))
      redis.call('LTRIM', log, 0, kept - 1)
      redis.call('PEXPIRE', log, horizon_ms)
      return {'admitted', s[1], c}, v
    end
  end
  return {'full', rid, fmt(counter)}, v
end
local W = 60000
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
