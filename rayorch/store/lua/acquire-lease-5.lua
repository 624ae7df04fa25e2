--[[ acquire-lease-5.lua: take a shard's lease; an epoch is never handed to two holders.

KEYS[1]  lease key      "epoch|token|driver", expires after the TTL
KEYS[2]  holder key     "epoch|token|driver" of the last acquisition (no TTL)
KEYS[3]  epoch counter  last epoch handed out (persistent)
KEYS[4]  seq counter    last sequence number of the shard
KEYS[5]  root stream    the shard's facts of the root Domain

ARGV[1]  driver id      ARGV[2] ttl in ms      ARGV[3] shard      ARGV[4] ts (wall clock)
ARGV[5]  token          unique per acquisition (fenced writes present it)
ARGV[6]  after epoch    "" for a plain acquisition; else the caller's own last epoch: it
                        re-acquires only if nobody held the shard since that epoch
ARGV[7]  after token    the token of that epoch ("" when unknown: epoch and driver only)

Returns: {1, epoch}            acquired as a new holder: epoch = max(counter, last holder) + 1
         {2, epoch}            the caller already holds it: TTL renewed, same epoch, the lease
                               now carries ARGV[5]
         {-20, epoch, driver}  another driver holds it (plain acquisition)
         {-11, epoch, driver}  (after epoch) driver continued the shard since: lease lost
         {-14, epoch, driver}  (after epoch) the store has no record of the caller's epoch
                               (restored from an older state): lease lost
Appends: on {1, ...}, LeaseAcquired as msgpack [1, "lease_acquired", ts, shard, driver,
epoch] (the rayorch fact codec), entry {f = bytes} with id "<seq>-0".
]]
--- @include "lease"
local lease, holderkey, epochkey, seqkey, stream = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local driver, ttl, token, after = ARGV[1], tonumber(ARGV[2]), ARGV[5], ARGV[6]

local held = redis.call('GET', lease)
if after ~= '' then
  local refusal = fence(lease, holderkey, epochkey, tonumber(after), ARGV[7], driver)
  if refusal and refusal[1] ~= -10 then return refusal end
elseif held then
  local e, _, d = parse_holder(held)
  if d ~= driver then return {-20, e, d} end
end
if held then  -- the caller holds it: renew under the new token
  local e = parse_holder(held)
  local value = e .. '|' .. token .. '|' .. driver
  redis.call('SET', lease, value, 'PX', ttl)
  redis.call('SET', holderkey, value)
  return {2, e}
end
local epoch = tonumber(redis.call('GET', epochkey) or '0')
local last = redis.call('GET', holderkey)
if last then epoch = math.max(epoch, (parse_holder(last))) end
epoch = epoch + 1
local value = epoch .. '|' .. token .. '|' .. driver
redis.call('SET', epochkey, epoch)
redis.call('SET', lease, value, 'PX', ttl)
redis.call('SET', holderkey, value)
local seq = redis.call('INCR', seqkey)
local fact = cmsgpack.pack({1, 'lease_acquired', tonumber(ARGV[4]), tonumber(ARGV[3]), driver, epoch})
redis.call('XADD', stream, seq .. '-0', 'f', fact)
return {1, epoch}
