--[[ release-payloads-2.lua: delivered sources no longer hold their segments.

KEYS[1]  payload_live     hash: segment -> how many undelivered sources have a value in it
KEYS[2]  payload_sources  hash: source index -> its segments, space-separated

ARGV[1..n]  indexes of sources whose OutputEmitted the store holds

Returns: the segments no source holds any more (the caller deletes them).
Idempotent: a released source holds nothing. Writes no stream entry.
]]
local live, sources = KEYS[1], KEYS[2]
local dead = {}
for i = 1, #ARGV do
  local held = redis.call('HGET', sources, ARGV[i])
  if held then
    redis.call('HDEL', sources, ARGV[i])
    for segment in string.gmatch(held, '%S+') do
      if redis.call('HINCRBY', live, segment, -1) <= 0 then
        redis.call('HDEL', live, segment)
        dead[#dead + 1] = segment
      end
    end
  end
end
return dead
