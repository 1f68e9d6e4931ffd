-- ARGV: P, rid, wp, lease_ms, admissions kept, their horizon (ms), slot triples (backend,
-- cap, candidate 1/0)...
require_numbers(3, 6)
require_numbers(8, #ARGV, 3)
local rid, wp, lease_ms = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
expire_waiters(now)
if redis.call('ZSCORE', P..'wl', rid) then redis.call('ZADD', P..'wl', now + lease_ms, rid) end
local r = try_admit(rid, now, lease_ms, wp, slot_list(7), tonumber(ARGV[5]), tonumber(ARGV[6]))
return r
