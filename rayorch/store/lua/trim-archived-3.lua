--[[ trim-archived-3.lua: trim a shard's facts that archive segments now hold.

KEYS[1]      holder key     "epoch|token|driver" of the shard's last lease acquisition
KEYS[2]      seq counter    last sequence number of the shard
KEYS[3]      archived       last seq the archive's segments hold (the watermark)
KEYS[4..3+s] fact streams   one per Domain of the run (ids "<seq>-0")
KEYS[4+s..]  Grain buckets  hashes "call|path" -> "phase:generation[:token]"
                            (rayorch/store/keys.py)

ARGV[1]      the holder value read before the archived facts were read ("" for none)
ARGV[2]      upto: every fact with seq <= upto is in archive segments
ARGV[3]      "1" when the shard is done (no Grain can be dispatched again): every Grain
             bucket given goes whole (a late report then finds no Grain and is refused),
             and so do the emptied streams
ARGV[4]      s, the number of fact streams in KEYS
ARGV[5..]    pairs: bucket index (the hash KEYS[3 + s + index]), grain field -- entries of
             sources whose delivery is archived: each is removed if its Grain is sealed (a
             late report then finds no Grain and is refused; a Grain still in flight keeps
             its entry). A bucket left empty is gone (Redis deletes an empty hash).

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
local s = tonumber(ARGV[4])
local trimmed = 0
for i = 4, 3 + s do
  trimmed = trimmed + redis.call('XTRIM', KEYS[i], 'MINID', (upto + 1) .. '-0')
end
if upto > tonumber(redis.call('GET', KEYS[3]) or '0') then
  redis.call('SET', KEYS[3], upto)
end
for i = 5, #ARGV, 2 do
  local bucket = KEYS[3 + s + tonumber(ARGV[i])]
  if entry_phase(redis.call('HGET', bucket, ARGV[i + 1])) == PHASE_SEALED then
    redis.call('HDEL', bucket, ARGV[i + 1])
  end
end
if ARGV[3] == '1' then
  for i = 4 + s, #KEYS do redis.call('DEL', KEYS[i]) end
  for i = 4, 3 + s do
    if redis.call('XLEN', KEYS[i]) == 0 then redis.call('DEL', KEYS[i]) end
  end
end
return {1, trimmed}
