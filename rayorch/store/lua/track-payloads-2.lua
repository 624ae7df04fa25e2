--[[ track-payloads-2.lua: count a payload segment as live for the sources with a value in it.

KEYS[1]  payload_live     hash: segment -> how many undelivered sources have a value in it
KEYS[2]  payload_sources  hash: source index -> its segments, space-separated

ARGV[1]  segment (object key)    ARGV[2..n] source indexes

Returns: how many sources newly hold the segment.
Called before the commit that names the segment, so no source can be delivered (and
released) before its values are counted. Idempotent: a retried call counts nothing twice.
Writes no stream entry.
]]
local live, sources, segment = KEYS[1], KEYS[2], ARGV[1]
local added = 0
for i = 2, #ARGV do
  local held = redis.call('HGET', sources, ARGV[i])
  if not held then
    redis.call('HSET', sources, ARGV[i], segment)
    added = added + 1
  elseif not string.find(' ' .. held .. ' ', ' ' .. segment .. ' ', 1, true) then
    redis.call('HSET', sources, ARGV[i], held .. ' ' .. segment)
    added = added + 1
  end
end
if added > 0 then
  redis.call('HINCRBY', live, segment, added)
end
return added
