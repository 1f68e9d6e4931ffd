-- ARGV: P, (tenant, budget period s)*: each tenant's tokens used in its current budget
-- period, as (tenant, period end ms, used)*
require_numbers(3, #ARGV, 2)
local now = now_ms()
local out = {}
for i = 2, #ARGV, 2 do
  local period_ms = tonumber(ARGV[i + 1]) * 1000
  local period_end = (math.floor(now / period_ms) + 1) * period_ms
  out[#out + 1] = ARGV[i]
  out[#out + 1] = fmt(period_end)
  out[#out + 1] = fmt(num(redis.call('GET', P..'b:'..ARGV[i]..':'..period_end)))
end
return out
