--[[ claim-content-1.lua: claim content keys for one document, all or none (dedup index).

KEYS[1]  claims hash of the scope: content key -> claimant (ro:{claims:<scope>})

ARGV[1]  claimant (a document's logical id)      ARGV[2..n]  the content keys

Returns: an array with one entry per key: the claimant for every key when the claim was
taken (no key was held by another claimant; keys it held already stay), else each key's
current holder (false: free) and nothing is written. Reads every key before any write.
Idempotent: the same claim repeated (a retry after a lost reply, a retried document)
answers the same.
]]
local key, claimant = KEYS[1], ARGV[1]
local fields = {}
for i = 2, #ARGV do fields[#fields + 1] = ARGV[i] end
local held = redis.call('HMGET', key, unpack(fields))
local free = true
for i = 1, #fields do
  if held[i] and held[i] ~= claimant then free = false end
end
if not free then return held end
local args = {}
for i = 1, #fields do
  args[#args + 1] = fields[i]
  args[#args + 1] = claimant
end
redis.call('HSET', key, unpack(args))
local out = {}
for i = 1, #fields do out[i] = claimant end
return out
