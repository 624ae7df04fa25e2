--[[ live-drivers-1.lua: the drivers of a run whose heartbeat deadline is in the future.

KEYS[1]  driver registry  zset: driver id -> heartbeat deadline (server unix ms)

Returns: the driver ids whose deadline is after the server's TIME (unsorted).
]]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
