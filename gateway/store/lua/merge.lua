-- ARGV: P, (tenant, counter)*
require_numbers(3, #ARGV, 2)
for i = 2, #ARGV, 2 do
  if tonumber(ARGV[i + 1]) > num(redis.call('HGET', P..'vtc', ARGV[i])) then
    redis.call('HSET', P..'vtc', ARGV[i], ARGV[i + 1])
  end
end
return 1
