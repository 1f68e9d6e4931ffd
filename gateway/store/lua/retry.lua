-- ARGV: P, rid, wp, lease_ms, slot pairs...
require_numbers(3, 4)
require_numbers(6, #ARGV, 2)
local rid, wp, lease_ms = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
expire_waiters(now)
if redis.call('ZSCORE', P..'wl', rid) then redis.call('ZADD', P..'wl', now + lease_ms, rid) end
return try_admit(rid, now, lease_ms, wp, 5)
