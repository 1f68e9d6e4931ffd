-- ARGV: P, retention_ms, max_records, then per record: n_fields, field, value, ...
-- A client record must name a request of its tenant that has not been reported yet.
local P = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local minid = tostring(math.max(0, now - tonumber(ARGV[2])))
local out = {}
local i = 4
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local f = {}
  for j = i + 1, i + 2 * n, 2 do f[ARGV[j]] = ARGV[j + 1] end
  local ok = 'ok'
  if f.side == 'client' then
    local rkey = P..'req:'..f.rid
    if redis.call('HGET', rkey, 'tenant') ~= f.tenant then
      ok = 'unknown'
    elseif redis.call('HSETNX', rkey, 'reported', '1') == 0 then
      ok = 'duplicate'
    end
  end
  if ok == 'ok' then
    redis.call('XADD', P..'tel', 'MINID', '~', minid, '*', unpack(ARGV, i + 1, i + 2 * n))
    local g = f.tenant..'|'..f.tier..'|'..f.side..'|'
    redis.call('HINCRBY', P..'agg', g..'n', 1)
    redis.call('HINCRBYFLOAT', P..'agg', g..'a', f.andes)
    redis.call('HINCRBYFLOAT', P..'agg', g..'m', f.monotone)
  end
  out[#out + 1] = ok
  i = i + 1 + 2 * n
end
redis.call('XTRIM', P..'tel', 'MAXLEN', '~', tonumber(ARGV[3]))
return out
