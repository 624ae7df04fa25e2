--[[ renew-lease-1.lua: extend (or release) the caller's lease of a shard.

KEYS[1]  lease key  "epoch|driver"
ARGV[1]  epoch      ARGV[2] driver      ARGV[3] ttl in ms, or "0" to release

Returns: {1}                  renewed (or released)
         {-10}                no live lease: expired or released
         {-11, current_epoch} fenced: the lease is held with another epoch or driver
Appends: nothing.
]]
local held = redis.call('GET', KEYS[1])
if not held then return {-10} end
local e, d = string.match(held, '^(%d+)|(.*)$')
if e ~= ARGV[1] or d ~= ARGV[2] then return {-11, tonumber(e)} end
if ARGV[3] == '0' then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
end
return {1}
