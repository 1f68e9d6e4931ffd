-- ARGV: P, rid, tenant, weight, model, ttft_ms, prompt, expected, wp, rpm, tpm, budget,
-- budget_period_s, max_queued, lease_ms, request ttl s, tier, ttft, tds, admissions kept,
-- their horizon (ms), max_concurrent (0: none), slot triples (backend, cap, candidate 1/0)...
require_numbers(4, 4)
if tonumber(ARGV[4]) <= 0 then error('argument 4 is not a weight') end
require_numbers(6, 16)
require_numbers(18, 22)
require_numbers(24, #ARGV, 3)
local rid, tenant, weight, model = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local ttft_ms, prompt, expected = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local wp, rpm, tpm = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local budget, period_s, max_queued = tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14])
local lease_ms, ttl = tonumber(ARGV[15]), tonumber(ARGV[16])
local kept, horizon_ms = tonumber(ARGV[20]), tonumber(ARGV[21])
local max_concurrent = tonumber(ARGV[22])
local now = now_ms()
expire_waiters(now)
local idx = math.floor(now / W)
local frac = (now - idx * W) / W
local rate = {0, 0, 0, 0, 0, 0}
local function answer(status, a, b, retry, by, position, wait)
  return {status, a, b, tostring(retry), by, rate[1], rate[2], tostring(rate[3]),
    rate[4], rate[5], tostring(rate[6]), position or 0, fmt(wait or 0)}
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
redis.call('HSET', P..'wr', rid, tenant..'\n'..weight..'\n'..prompt..'\n'..model)
redis.call('HSET', P..'tw', tenant, weight)
if max_concurrent > 0 then
  redis.call('HSET', P..'tc', tenant..'|'..model, max_concurrent)
else
  redis.call('HDEL', P..'tc', tenant..'|'..model)
end
local slots = slot_list(23)
local r, v = try_admit(rid, now, lease_ms, wp, slots, kept, horizon_ms)
if r[1] == 'admitted' then return answer(r[1], r[2], r[3], 0, '') end
local position = 0
for i, id in ipairs(queue_order(v, model)) do
  if id == rid then position = i; break end
end
local wait = position * admission_interval(model, now, horizon_ms)
return answer(r[1], r[2], r[3], 0, '', position, wait)
