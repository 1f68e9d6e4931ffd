-- ARGV: P, lease_ms, n_slots, (backend, rid)*n_slots, waiting rids...
require_numbers(2, 3)
local now = now_ms()
local until_ms = now + tonumber(ARGV[2])
local n = tonumber(ARGV[3])
for i = 0, n - 1 do
  redis.call('ZADD', P..'s:'..ARGV[4 + 2 * i], until_ms, ARGV[5 + 2 * i])
end
for i = 4 + 2 * n, #ARGV do redis.call('ZADD', P..'wl', 'XX', until_ms, ARGV[i]) end
return 1
