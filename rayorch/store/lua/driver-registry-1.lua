--[[ driver-registry-1.lua: the run's driver registry with the server's clock.

KEYS[1]  driver registry  zset: driver id -> heartbeat deadline (server unix ms)

Returns: {now_ms, driver1, deadline1, driver2, deadline2, ...} (all entries, live or not).
]]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {now}
local entries = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #entries, 2 do
  out[#out + 1] = entries[i]
  out[#out + 1] = math.floor(tonumber(entries[i + 1]))
end
return out
