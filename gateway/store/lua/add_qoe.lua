-- ARGV: P, retention_ms, max_records, n_levels, (bucket size s, keep s)*n_levels,
--   n_records, per record: per_minute (a client report's telemetry limit, 0: none),
--     n_fields, (field, value)*, then its own aggregate, applied only if it is stored:
--     n_sums, (field, value)*, n_maxima, (field, value)*;
--   n_groups, per group (applied whatever the records' results: the gateway's records):
--     tenant, n_sums, (field, value)*, n_maxima, (field, value)*.
-- A client record must name a request of its tenant that has not been reported yet, and
-- is then charged to its tenant's limit. Every argument is read and checked before
-- anything is written: a record with a number that is not finite is 'invalid' and
-- nothing of it is written; an aggregate that is not is refused before any write.
local NUMERIC = {andes = true, monotone = true, dandes = true, dmono = true,
  lf = true, nf = true, idle = true, away = true}
-- n (field, value) pairs from ARGV[i]: the pairs, whether every value is finite, next i
local function read_pairs(i, n)
  local out, ok = {}, n ~= nil and n >= 0
  for j = 0, (n or 0) - 1 do
    local value = ARGV[i + 2 * j + 1]
    local x = finite(value)
    if x == nil or x < 0 then ok = false end
    out[#out + 1] = {ARGV[i + 2 * j], value, x}
  end
  return out, ok, i + 2 * (n or 0)
end
local levels = {}
local i = 5
for _ = 1, tonumber(ARGV[4]) do
  levels[#levels + 1] = {tonumber(ARGV[i]), tonumber(ARGV[i + 1])}
  i = i + 2
end
local records = {}
local n_records = tonumber(ARGV[i])
i = i + 1
for r = 1, n_records do
  local limit, n = tonumber(ARGV[i]) or 0, tonumber(ARGV[i + 1]) or 0
  local first = i + 2
  local f, ok = {}, true
  for j = first, first + 2 * n - 1, 2 do
    f[ARGV[j]] = ARGV[j + 1]
    if NUMERIC[ARGV[j]] and finite(ARGV[j + 1]) == nil then ok = false end
  end
  if not (f.rid and f.tenant and f.tier and f.side and f.andes and f.monotone) then ok = false end
  i = first + 2 * n
  local sums, maxima, ok1, ok2
  sums, ok1, i = read_pairs(i + 1, tonumber(ARGV[i]))
  maxima, ok2, i = read_pairs(i + 1, tonumber(ARGV[i]))
  records[r] = {limit = limit, f = f, first = first, n = n, sums = sums, maxima = maxima,
    ok = ok and ok1 and ok2}
end
local groups = {}
local n_groups = tonumber(ARGV[i])
i = i + 1
for _ = 1, n_groups do
  local tenant = ARGV[i]
  local sums, maxima, ok1, ok2
  sums, ok1, i = read_pairs(i + 2, tonumber(ARGV[i + 1]))
  maxima, ok2, i = read_pairs(i + 1, tonumber(ARGV[i]))
  if not (tenant and ok1 and ok2) then
    return redis.error_reply('ERR add_qoe: an aggregate is not a set of finite numbers')
  end
  groups[#groups + 1] = {tenant, sums, maxima}
end
-- writes
local now = now_ms()
local second = math.floor(now / 1000)
local minid = tostring(math.max(0, math.floor(now) - tonumber(ARGV[2])))
local function aggregate(tenant, sums, maxima)
  redis.call('SADD', P..'qat', tenant)
  for _, level in ipairs(levels) do
    local size, keep = level[1], level[2]
    local start = second - second % size
    local key = P..'qa:'..size..':'..start..':'..tenant
    for _, kv in ipairs(sums) do redis.call('HINCRBYFLOAT', key, kv[1], kv[2]) end
    for _, kv in ipairs(maxima) do
      local current = finite(redis.call('HGET', key, kv[1]))
      if current == nil or kv[3] > current then redis.call('HSET', key, kv[1], kv[2]) end
    end
    redis.call('EXPIREAT', key, start + size + keep)
  end
end
local out = {}
for _, rec in ipairs(records) do
  local f, status = rec.f, 'ok'
  if not rec.ok then
    status = 'invalid'
  elseif f.side == 'client' then
    local rkey = P..'req:'..f.rid
    if redis.call('HGET', rkey, 'tenant') ~= f.tenant then
      status = 'unknown'
    elseif redis.call('HEXISTS', rkey, 'reported') == 1 then
      status = 'duplicate'
    elseif rec.limit > 0 then
      local idx = math.floor(now / W)
      local frac = (now - idx * W) / W
      local prev, cur = window('xtel', f.tenant, idx)
      local wait = wait_ms(rec.limit, 1, prev, cur, frac)
      if wait ~= 0 then status = 'limited:'..wait else bump('xtel', f.tenant, idx, 1) end
    end
    if status == 'ok' then redis.call('HSET', rkey, 'reported', '1') end
  end
  if status == 'ok' then
    redis.call('XADD', P..'tel', 'MINID', '~', minid, '*',
      unpack(ARGV, rec.first, rec.first + 2 * rec.n - 1))
    if #rec.sums > 0 or #rec.maxima > 0 then aggregate(f.tenant, rec.sums, rec.maxima) end
  end
  out[#out + 1] = status
end
for _, g in ipairs(groups) do aggregate(g[1], g[2], g[3]) end
redis.call('XTRIM', P..'tel', 'MAXLEN', '~', tonumber(ARGV[3]))
return out
