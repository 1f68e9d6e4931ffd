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
