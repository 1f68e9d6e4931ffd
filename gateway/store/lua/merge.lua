-- ARGV: P, (tenant, counter)*
for i = 2, #ARGV, 2 do
  if tonumber(ARGV[i + 1]) > num(redis.call('HGET', P..'vtc', ARGV[i])) then
    redis.call('HSET', P..'vtc', ARGV[i], ARGV[i + 1])
  end
end
return 1
