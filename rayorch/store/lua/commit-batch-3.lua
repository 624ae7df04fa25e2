--[[ commit-batch-3.lua: the commit gate (docs/ARCHITECTURE.md, "Semantics" 4) for one shard's worker reports.

KEYS[1]      grains hash    "call|path" -> "phase:generation[:token]"
KEYS[2]      barriers set   "call|parent_path"
KEYS[3]      seq counter    last sequence number of the shard
KEYS[4..]    fact streams   one per Domain the reports use (ids "<seq>-0")

ARGV[1]      n, the number of reports
ARGV[2]      token, unique per call (a retried call after a lost reply answers as before)
then 6 per report i (base = 2 + (i-1)*6):
  +1 grain field "call|path"     +2 report generation (decimal)
  +3 barrier member ("" = root Grain: no parent, no barrier)
  +4 "1" if this report installs a barrier (group_failure of a child Grain), else "0"
  +5 stream index: the report's stream is KEYS[3 + index]
  +6 msgpack bytes of the GrainCommitted fact
ARGV[2 + 6n + 1 ..]  msgpack bytes of one BarrierInstalled fact per report flagged "1" in +4,
                     in report order (used only for those accepted)

Returns: one verdict per report, the codes of rayorch.core.commit.CommitVerdict:
   1 ACCEPTED  -1 NOT_DISPATCHED  -2 STALE  -3 SEALED  -4 BARRED
Appends: for each accepted report, in order, GrainCommitted and (if it installs one)
BarrierInstalled, each as an entry {f = fact bytes} with id "<seq>-0".
Every check runs before any write; later reports see earlier reports' effects.
Grain entries: an accepted report seals its Grain as "3:gen:token:i" (PHASE_SEALED).
Cost per report: the Grain entries are read with one HMGET and sealed with one HSET per
call (in chunks of CHUNK fields: unpack() has a stack limit); one XADD per fact written.
]]
--- @include "vocabulary"
local grains, barriers, seqkey = KEYS[1], KEYS[2], KEYS[3]
local n = tonumber(ARGV[1])
local token = ARGV[2]
local CHUNK = 1000

local current = {}      -- report index -> stored Grain entry (false: none)
do
  local fields = {}
  for i = 1, n do fields[i] = ARGV[2 + (i - 1) * 6 + 1] end
  for first = 1, n, CHUNK do
    local last = math.min(first + CHUNK - 1, n)
    local got = redis.call('HMGET', grains, unpack(fields, first, last))
    for j = 1, last - first + 1 do current[first + j - 1] = got[j] end
  end
end

local overlay = {}      -- grain field -> new value (sealed by this call)
local barred = {}       -- member -> true/false (the barrier set, read once per parent)
local verdicts = {}
local accepted = {}     -- report indexes to write, in order
local sealed = {}       -- HSET arguments: field, value, ...
local barrier_of = {}   -- report index -> ARGV index of its BarrierInstalled bytes
local barrier_arg = 2 + 6 * n
local writes = 0

for i = 1, n do
  local b = 2 + (i - 1) * 6
  local field, gen, member = ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local installs = ARGV[b + 4] == '1'
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
    sealed[#sealed + 1] = field
    sealed[#sealed + 1] = value
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
  for first = 1, #sealed, 2 * CHUNK do
    redis.call('HSET', grains, unpack(sealed, first, math.min(first + 2 * CHUNK - 1, #sealed)))
  end
  local seq = redis.call('INCRBY', seqkey, writes) - writes
  for _, i in ipairs(accepted) do
    local b = 2 + (i - 1) * 6
    local stream = KEYS[3 + tonumber(ARGV[b + 5])]
    seq = seq + 1
    redis.call('XADD', stream, seq .. '-0', 'f', ARGV[b + 6])
    if barrier_of[i] then
      seq = seq + 1
      redis.call('XADD', stream, seq .. '-0', 'f', ARGV[barrier_of[i]])
      redis.call('SADD', barriers, ARGV[b + 3])
    end
  end
end
return verdicts
