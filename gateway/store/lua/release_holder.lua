-- ARGV: P, holder tag, backends...: the slots on those backends and the queue places of
-- every request id that begins with the tag (a holder that is gone); answers their count
local tag = ARGV[2]
local function held(rid) return string.sub(rid, 1, #tag) == tag end
local n = 0
for i = 3, #ARGV do
  local key = P..'s:'..ARGV[i]
  for _, rid in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    if held(rid) then
      redis.call('ZREM', key, rid)
      n = n + 1
    end
  end
end
for _, rid in ipairs(redis.call('ZRANGE', P..'wl', 0, -1)) do
  if held(rid) then
    drop_waiter(rid)
    n = n + 1
  end
end
return n
