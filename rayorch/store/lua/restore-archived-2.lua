--[[ restore-archived-2.lua: a shard whose Redis went back behind its archive catches up.

After a restore from an older snapshot (or an async replica promoted), Redis may hold fewer
facts than the archive's segments. Facts appended from then on must not reuse an archived
seq, and the commit gate must know the Grains those archived facts sealed.

KEYS[1]      seq counter    last sequence number of the shard
KEYS[2]      archived       last seq the archive's segments hold
KEYS[3..]    Grain buckets  hashes "call|path" -> "phase:generation[:token]" (rayorch/store/keys.py)

ARGV[1]      the archive's watermark (last seq its segments hold)
ARGV[2..]    triples: bucket index (the entry's hash is KEYS[2 + index]), grain field, entry
             "phase:generation" -- the Grain table as the archived facts past the store's
             seq counter leave it, in seq order

Returns: {1, seq before}   raised to the watermark (the Grain entries written)
         {0, seq}          the store already holds as many facts: nothing written
]]
local floor = tonumber(ARGV[1])
local held = tonumber(redis.call('GET', KEYS[1]) or '0')
if held >= floor then return {0, held} end
for i = 2, #ARGV, 3 do
  redis.call('HSET', KEYS[2 + tonumber(ARGV[i])], ARGV[i + 1], ARGV[i + 2])
end
redis.call('SET', KEYS[1], floor)
if floor > tonumber(redis.call('GET', KEYS[2]) or '0') then
  redis.call('SET', KEYS[2], floor)
end
return {1, held}
