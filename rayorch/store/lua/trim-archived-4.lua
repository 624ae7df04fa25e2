--[[ trim-archived-4.lua: trim a shard's facts that archive segments now hold.

KEYS[1]      holder key     "epoch|token|driver" of the shard's last lease acquisition
KEYS[2]      seq counter    last sequence number of the shard
KEYS[3]      archived       last seq the archive's segments hold (the watermark)
KEYS[4]      grains hash    "call|path" -> "phase:generation[:token]"
KEYS[5..]    fact streams   one per Domain of the run (ids "<seq>-0")

ARGV[1]      the holder value read before the archived facts were read ("" for none)
ARGV[2]      upto: every fact with seq <= upto is in archive segments
ARGV[3]      "1" when the shard is done (no Grain can be dispatched again): its Grain
             table goes too (a late report then finds no Grain and is refused), and so do
             its emptied streams
ARGV[4..]    Grain fields of sources whose delivery is archived: each is removed from the
             Grain table if its Grain is sealed (a late report then finds no Grain and is
             refused; a Grain still in flight keeps its entry)

Returns: {1, entries trimmed}
         {-16, holder}     fenced: a lease was acquired since the facts were read
         {-17, held}       the store holds fewer facts than upto (it went back): nothing
                           trimmed, nothing written
Writes no stream entry. Every check runs before any write.
]]
--- @include "vocabulary"
local holder = redis.call('GET', KEYS[1]) or ''
if holder ~= ARGV[1] then return {-16, holder} end
local upto = tonumber(ARGV[2])
local held = tonumber(redis.call('GET', KEYS[2]) or '0')
if held < upto then return {-17, held} end
local trimmed = 0
for i = 5, #KEYS do
  trimmed = trimmed + redis.call('XTRIM', KEYS[i], 'MINID', (upto + 1) .. '-0')
end
if upto > tonumber(redis.call('GET', KEYS[3]) or '0') then
  redis.call('SET', KEYS[3], upto)
end
for i = 4, #ARGV do
  if entry_phase(redis.call('HGET', KEYS[4], ARGV[i])) == PHASE_SEALED then
    redis.call('HDEL', KEYS[4], ARGV[i])
  end
end
if ARGV[3] == '1' then
  redis.call('DEL', KEYS[4])
  for i = 5, #KEYS do
    if redis.call('XLEN', KEYS[i]) == 0 then redis.call('DEL', KEYS[i]) end
  end
end
return {1, trimmed}
