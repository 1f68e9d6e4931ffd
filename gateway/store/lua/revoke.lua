-- ARGV: P, tenant, digest
local P = ARGV[1]
if redis.call('HGET', P..'keys', ARGV[3]) ~= ARGV[2] then return 0 end
redis.call('HDEL', P..'keys', ARGV[3])
redis.call('SADD', P..'revoked', ARGV[3])
redis.call('INCR', P..'keyver')
return 1
