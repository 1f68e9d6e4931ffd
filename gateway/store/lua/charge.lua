-- ARGV: P, wq, (tenant, weight, tokens, budget_period_s)*
require_numbers(2, 2)
for i = 3, #ARGV, 4 do
  require_numbers(i + 1, i + 3)
  if tonumber(ARGV[i + 1]) <= 0 then error('argument '..(i + 1)..' is not a weight') end
end
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
