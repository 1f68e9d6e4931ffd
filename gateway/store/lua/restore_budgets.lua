-- ARGV: P, (tenant, period end ms, used)*: each budget period still running uses at
-- least ``used`` tokens (a replica restoring a store that lost its data: the largest of
-- what the replicas last saw wins)
require_numbers(3, #ARGV, 3)
require_numbers(4, #ARGV, 3)
local now = now_ms()
local n = 0
for i = 2, #ARGV, 3 do
  local period_end, used = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local key = P..'b:'..ARGV[i]..':'..ARGV[i + 1]
  if period_end > now and used > num(redis.call('GET', key)) then
    redis.call('SET', key, fmt(used))
    redis.call('PEXPIREAT', key, period_end + W)
    n = n + 1
  end
end
return n
