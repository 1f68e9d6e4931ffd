-- ARGV: P, tenant, window kind ('x'..name, or 'r': the requests arrive.lua counts), limit
require_numbers(4, 4)
local now = now_ms()
local idx = math.floor(now / W)
local frac = (now - idx * W) / W
local kind = ARGV[3]
local prev, cur = window(kind, ARGV[2], idx)
local wait = wait_ms(tonumber(ARGV[4]), 1, prev, cur, frac)
if wait ~= 0 then return tostring(wait) end
bump(kind, ARGV[2], idx, 1)
return '0'
