local P = ARGV[1]
if redis.call('SISMEMBER', P..'revoked', ARGV[3]) == 1 then return 0 end
redis.call('HSET', P..'keys', ARGV[3], ARGV[2])
redis.call('INCR', P..'keyver')
return 1
