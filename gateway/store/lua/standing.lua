-- ARGV: P, model, admissions' horizon (ms), n, request ids (n), slot triples...
require_numbers(3, 4)
require_numbers(6 + tonumber(ARGV[4]), #ARGV, 3)
local model, horizon_ms, n = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
expire_waiters(now)
local asked = {}
for i = 5, 4 + n do asked[ARGV[i]] = true end
local out = {fmt(admission_interval(model, now, horizon_ms))}
for i, id in ipairs(queue_order(queue_view(model, slot_list(5 + n), now), model)) do
  if asked[id] then
    out[#out + 1] = id
    out[#out + 1] = i
  end
end
return out
