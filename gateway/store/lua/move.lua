-- ARGV: P, rid, source backend, target backend, target capacity (0: none), lease_ms
require_numbers(5, 6)
local rid, target, cap = ARGV[2], P..'s:'..ARGV[4], tonumber(ARGV[5])
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', target, '-inf', now)
if cap > 0 and redis.call('ZCARD', target) >= cap then return 0 end
redis.call('ZREM', P..'s:'..ARGV[3], rid)
redis.call('ZADD', target, now + tonumber(ARGV[6]), rid)
return 1
