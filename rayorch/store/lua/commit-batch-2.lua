--[[ commit-batch-2.lua: the commit gate (docs/ARCHITECTURE.md, "Semantics" 4) for one shard's worker reports.

KEYS[1]      barriers set   "call|parent_path"
KEYS[2]      seq counter    last sequence number of the shard
KEYS[3..]    fact streams (one per Domain the reports use, ids "<seq>-0") and Grain buckets
             (hashes "call|path" -> "phase:generation[:token]", one per bucket the reports
             use, rayorch/store/keys.py), in any order: each report names its two

ARGV[1]      n, the number of reports
ARGV[2]      token, unique per call (a retried call after a lost reply answers as before)
then 7 per report i (base = 2 + (i-1)*7):
  +1 grain field "call|path"
  +2 bucket index: the report's Grain entry is in the hash KEYS[2 + index]
  +3 report generation (decimal)
  +4 barrier member ("" = root Grain: no parent, no barrier)
  +5 "1" if this report installs a barrier (group_failure of a child Grain), else "0"
  +6 stream index: the report's stream is KEYS[2 + index]
  +7 msgpack bytes of the GrainCommitted fact
ARGV[2 + 7n + 1 ..]  msgpack bytes of one BarrierInstalled fact per report flagged "1" in +5,
                     in report order (used only for those accepted)

Returns: one verdict per report, the codes of rayorch.core.commit.CommitVerdict:
   1 ACCEPTED  -1 NOT_DISPATCHED  -2 STALE  -3 SEALED  -4 BARRED
Appends: for each accepted report, in order, GrainCommitted and (if it installs one)
BarrierInstalled, each as an entry {f = fact bytes} with id "<seq>-0".
Every check runs before any write; later reports see earlier reports' effects.
Grain entries: an accepted report seals its Grain as "3:gen:token:i" (PHASE_SEALED).
Cost per report: the Grain entries are read with one HMGET and sealed with one HSET per
bucket (in chunks of CHUNK fields: unpack() has a stack limit); one XADD per fact written.
]]
--- @include "vocabulary"
local barriers, seqkey = KEYS[1], KEYS[2]
local n = tonumber(ARGV[1])
local token = ARGV[2]
local CHUNK = 1000
local PER = 7

local current = {}      -- report index -> stored Grain entry (false: none)
local buckets = {}      -- bucket index -> {report indexes}, in first-seen order
local order = {}
for i = 1, n do
  local bucket = tonumber(ARGV[2 + (i - 1) * PER + 2])
  local members = buckets[bucket]
  if not members then
    members = {}
    buckets[bucket] = members
    order[#order + 1] = bucket
  end
  members[#members + 1] = i
end
for _, bucket in ipairs(order) do
  local members = buckets[bucket]
  for first = 1, #members, CHUNK do
    local last = math.min(first + CHUNK - 1, #members)
    local fields = {}
    for j = first, last do fields[#fields + 1] = ARGV[2 + (members[j] - 1) * PER + 1] end
    local got = redis.call('HMGET', KEYS[2 + bucket], unpack(fields))
    for j = first, last do current[members[j]] = got[j - first + 1] end
  end
end

local overlay = {}      -- grain field -> new value (sealed by this call)
local barred = {}       -- member -> true/false (the barrier set, read once per parent)
local verdicts = {}
local accepted = {}     -- report indexes to write, in order
local sealed = {}       -- bucket index -> HSET arguments: field, value, ...
local barrier_of = {}   -- report index -> ARGV index of its BarrierInstalled bytes
local barrier_arg = 2 + PER * n
local writes = 0

for i = 1, n do
  local b = 2 + (i - 1) * PER
  local field, gen, member = ARGV[b + 1], ARGV[b + 3], ARGV[b + 4]
  local installs = ARGV[b + 5] == '1'
  if installs then barrier_arg = barrier_arg + 1 end
  local cur = overlay[field]
  if cur == nil then cur = current[i] end
  local phase = entry_phase(cur)
  local v
  if phase == PHASE_SEALED then
    local ctoken = string.match(cur, '^%d+:%d+:(.*)$')
    if ctoken == token .. ':' .. i then v = VERDICT_ACCEPTED else v = VERDICT_SEALED end  -- replay
  elseif phase ~= PHASE_IN_FLIGHT then
    v = VERDICT_NOT_DISPATCHED
  elseif member ~= '' and barred[member] ~= false and
      (barred[member] or redis.call('SISMEMBER', barriers, member) == 1) then
    barred[member] = true
    v = VERDICT_BARRED
  elseif cur ~= PHASE_IN_FLIGHT .. ':' .. gen and
      tonumber(string.match(cur, '^%d+:(%d+)')) ~= tonumber(gen) then
    v = VERDICT_STALE
  else
    v = VERDICT_ACCEPTED
    local value = PHASE_SEALED .. ':' .. gen .. ':' .. token .. ':' .. i
    overlay[field] = value
    local bucket = tonumber(ARGV[b + 2])
    local args = sealed[bucket]
    if not args then
      args = {}
      sealed[bucket] = args
    end
    args[#args + 1] = field
    args[#args + 1] = value
    accepted[#accepted + 1] = i
    writes = writes + 1
    if member ~= '' and barred[member] == nil then barred[member] = false end
    if installs then
      barred[member] = true
      barrier_of[i] = barrier_arg
      writes = writes + 1
    end
  end
  verdicts[i] = v
end

if writes > 0 then
  for _, bucket in ipairs(order) do
    local args = sealed[bucket]
    if args then
      for first = 1, #args, 2 * CHUNK do
        redis.call('HSET', KEYS[2 + bucket],
                   unpack(args, first, math.min(first + 2 * CHUNK - 1, #args)))
      end
    end
  end
  local seq = redis.call('INCRBY', seqkey, writes) - writes
  for _, i in ipairs(accepted) do
    local b = 2 + (i - 1) * PER
    local stream = KEYS[2 + tonumber(ARGV[b + 6])]
    seq = seq + 1
    redis.call('XADD', stream, seq .. '-0', 'f', ARGV[b + 7])
    if barrier_of[i] then
      seq = seq + 1
      redis.call('XADD', stream, seq .. '-0', 'f', ARGV[barrier_of[i]])
      redis.call('SADD', barriers, ARGV[b + 4])
    end
  end
end
return verdicts
