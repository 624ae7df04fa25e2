--[[ renew-lease-3.lua: extend (or release) the caller's lease of a shard.

KEYS[1]  lease key      "epoch|token|driver"
KEYS[2]  holder key     "epoch|token|driver" of the last acquisition
KEYS[3]  epoch counter  raised to the caller's epoch if below it (see includes/lease.lua)
ARGV[1]  epoch      ARGV[2] driver      ARGV[3] ttl in ms, or "0" to release
ARGV[4]  token      of the caller's acquisition ("" when unknown: epoch and driver only)

Returns: {1}                  renewed (or released)
         {-10}                no live lease: expired or released, nobody held it since
         {-11, epoch, driver} fenced: driver holds or held the shard since (lease lost)
         {-14, epoch, driver} the store has no record of the caller's epoch (restored from an
                              older state)
Appends: nothing.
]]
--- @include "lease"
local refusal = fence(KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[1]), ARGV[4], ARGV[2])
if refusal then return refusal end
if ARGV[3] == '0' then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
end
return {1}
