--[[ heartbeat-1.lua: register a driver as alive on a run, by the server's clock.

KEYS[1]  driver registry  zset: driver id -> heartbeat deadline (server unix ms)

ARGV[1]  driver id      ARGV[2] ttl in ms (0: the driver left)

Returns: the server time in ms.
Also removes drivers whose deadline passed more than an hour ago. Server time (TIME)
makes a driver whose clock is wrong unable to evict the others (the leases use
PEXPIRE, also server time).
]]
local key, driver, ttl = KEYS[1], ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ttl <= 0 then
  redis.call('ZREM', key, driver)
  return now
end
redis.call('ZADD', key, now + ttl, driver)
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - 3600000)
return now
