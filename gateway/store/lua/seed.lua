-- ARGV: P, n, revoked digest * n, (digest, tenant)* ; KEYS none. Revocations first and
-- for good; then keys, unless revoked. Seeding the configured keys is the case n = 0; a
-- replica restoring a store that lost its data passes its whole key table.
local P = ARGV[1]
local n = tonumber(ARGV[2])
local changed = 0
for i = 3, 2 + n do
  changed = changed + redis.call('SADD', P..'revoked', ARGV[i])
  changed = changed + redis.call('HDEL', P..'keys', ARGV[i])
end
for i = 3 + n, #ARGV, 2 do
  if redis.call('SISMEMBER', P..'revoked', ARGV[i]) == 0 then
    changed = changed + redis.call('HSET', P..'keys', ARGV[i], ARGV[i + 1])
  end
end
if changed > 0 then redis.call('INCR', P..'keyver') end
return changed
