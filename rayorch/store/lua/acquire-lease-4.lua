--[[ acquire-lease-4.lua: take a shard's lease; the epoch (fencing token) never goes back.

KEYS[1]  lease key      "epoch|driver", expires after the TTL
KEYS[2]  epoch counter  last epoch handed out (persistent)
KEYS[3]  seq counter    last sequence number of the shard
KEYS[4]  root stream    the shard's facts of the root Domain

ARGV[1]  driver id      ARGV[2] ttl in ms      ARGV[3] shard      ARGV[4] ts (wall clock)

Returns: {1, epoch}            acquired as a new holder: epoch = previous + 1
         {2, epoch}            the caller already holds it: TTL renewed, same epoch
         {-20, epoch, driver}  another driver holds it
Appends: on {1, ...}, LeaseAcquired as msgpack [1, "lease_acquired", ts, shard, driver,
epoch] (the rayorch fact codec), entry {f = bytes} with id "<seq>-0".
]]
local lease, epochkey, seqkey, stream = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local driver, ttl = ARGV[1], tonumber(ARGV[2])

local held = redis.call('GET', lease)
if held then
  local e, d = string.match(held, '^(%d+)|(.*)$')
  if d ~= driver then return {-20, tonumber(e), d} end
  redis.call('PEXPIRE', lease, ttl)
  return {2, tonumber(e)}
end
local epoch = redis.call('INCR', epochkey)
redis.call('SET', lease, epoch .. '|' .. driver, 'PX', ttl)
local seq = redis.call('INCR', seqkey)
local fact = cmsgpack.pack({1, 'lease_acquired', tonumber(ARGV[4]), tonumber(ARGV[3]), driver, epoch})
redis.call('XADD', stream, seq .. '-0', 'f', fact)
return {1, epoch}
