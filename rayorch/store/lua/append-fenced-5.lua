--[[ append-fenced-5.lua: append driver facts to one shard if the caller holds its lease.

KEYS[1]      lease key      "epoch|token|driver" (expires with the lease TTL)
KEYS[2]      holder key     "epoch|token|driver" of the last acquisition
KEYS[3]      epoch counter  raised to the caller's epoch if below it (includes/lease.lua)
KEYS[4]      seq counter    last sequence number of the shard
KEYS[5]      lastop         "token:first_seq" of the last append (a retry after a lost reply)
KEYS[6..]    fact streams (one per Domain the facts use, ids "<seq>-0") and Grain buckets
             (hashes "call|path" -> "phase:generation[:token]", one per bucket the facts
             and commits use, rayorch/store/keys.py), in any order: ARGV names each one's

ARGV[1]      the caller's epoch (fencing token)
ARGV[2]      call token, unique per call
ARGV[3]      n, the number of facts
ARGV[4]      the caller's driver id
ARGV[5]      the caller's holder token ("" when unknown: epoch and driver only)
ARGV[6]      basis: the last seq of the shard the caller read when it rebuilt it ("0": none)
ARGV[7]      basis: the first seq of the caller's latest append since ("0": none)
ARGV[8]      m, the number of commits the caller folded since that append, then 3 per
             commit j (base = 8 + 3(j-1)): +1 grain field, +2 bucket index (its entry is in
             KEYS[5 + index]), +3 generation
then 6 per fact i (base = 8 + 3m + (i-1)*6):
  +1 kind (FactKind): 0 other, 1 GrainDispatched, 2 GrainRetried, 3 GrainFailed,
     4 GrainReused
  +2 grain field "call|path" ("" for kind 0)
  +3 bucket index: the Grain's entry is in KEYS[5 + index] ("0" for kind 0)
  +4 generation
  +5 stream index: the fact's stream is KEYS[5 + index]
  +6 msgpack bytes of the fact

Returns: {1, first_seq}            appended as first_seq .. first_seq + n - 1
         {2, first_seq}            this call token was already appended (nothing written)
         {-10}                     no live lease: expired or released, nobody held it since
         {-11, epoch, driver}      fenced: driver holds or held the shard since
         {-14, epoch, driver}      the store has no record of the caller's epoch (restored
                                   from an older state)
         {-12, i, j, ...}          facts i, j, ... name sealed Grains (nothing written)
         {-15, reason, ...}        the store went back: it no longer holds what the
                                   caller's state rests on (nothing written); reason
                                   1, last seq, ARGV[6]: fewer facts than the caller read
                                   2, first seq of the latest append, ARGV[7]: the
                                      caller's latest append is gone
                                   3, j, k, ...: commits j, k, ... are not sealed with
                                      their generation
Appends: every fact, in order, as an entry {f = fact bytes} with id "<seq>-0".
The basis check runs after the fence: the shard's log loses a suffix in a rollback, so
the caller's latest append still being the shard's latest one (lastop) vouches for all it
knew before it; the counter for what it read; the Grain table for the commits after.
Grain table (PHASE_AFTER): Dispatched -> "2:gen" (in flight), Retried -> "1:gen" (ready),
Failed and Reused -> "3:gen" (sealed). Every check runs before any write (a refused fence only
raises the epoch counter).
]]
--- @include "lease"
--- @include "vocabulary"
local seqkey, lastop = KEYS[4], KEYS[5]
local token, n = ARGV[2], tonumber(ARGV[3])
local read_seq, appended_first, m = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local FACT0 = 8 + 3 * m
local PER = 6

local last = redis.call('GET', lastop)
local last_first = 0
if last then
  local t, first = string.match(last, '^(.*):(%d+)$')
  if t == token then return {2, tonumber(first)} end
  last_first = tonumber(first)
end

local refusal = fence(KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[1]), ARGV[5], ARGV[4])
if refusal then return refusal end

local held = tonumber(redis.call('GET', seqkey) or '0')
if held < read_seq then return {-15, 1, held, read_seq} end
if appended_first > 0 and last_first ~= appended_first then
  return {-15, 2, last_first, appended_first}
end
local gone = {-15, 3}
for j = 1, m do
  local b = 8 + 3 * (j - 1)
  local entry = redis.call('HGET', KEYS[5 + tonumber(ARGV[b + 2])], ARGV[b + 1])
  if entry_phase(entry) ~= PHASE_SEALED or entry_generation(entry) ~= ARGV[b + 3] then
    gone[#gone + 1] = j
  end
end
if #gone > 2 then return gone end

local overlay = {}      -- grain field -> new value
local bucket_of = {}    -- grain field -> the key of its bucket
local conflicts = {}
for i = 1, n do
  local b = FACT0 + (i - 1) * PER
  local kind = tonumber(ARGV[b + 1])
  if kind ~= KIND_OTHER then
    local field = ARGV[b + 2]
    local cur = overlay[field]
    if cur == nil then
      bucket_of[field] = KEYS[5 + tonumber(ARGV[b + 3])]
      cur = redis.call('HGET', bucket_of[field], field)
    end
    if entry_phase(cur) == PHASE_SEALED then
      conflicts[#conflicts + 1] = i
    else
      overlay[field] = PHASE_AFTER[kind] .. ':' .. ARGV[b + 4]
    end
  end
end
if #conflicts > 0 then
  table.insert(conflicts, 1, -12)
  return conflicts
end

local seq = redis.call('INCRBY', seqkey, n) - n
local first = seq + 1
for field, value in pairs(overlay) do
  redis.call('HSET', bucket_of[field], field, value)
end
for i = 1, n do
  local b = FACT0 + (i - 1) * PER
  seq = seq + 1
  redis.call('XADD', KEYS[5 + tonumber(ARGV[b + 5])], seq .. '-0', 'f', ARGV[b + 6])
end
redis.call('SET', lastop, token .. ':' .. first)
return {1, first}
