--[[ includes/vocabulary.lua: the numbers of rayorch/core/vocabulary.py that the scripts use.

tests/unit/test_vocabulary.py checks every constant below against that table.
A Grain entry of the grains hash reads "<phase>:<generation>[:token]", one digit per phase.
]]

-- GrainPhase
local PHASE_READY = 1
local PHASE_IN_FLIGHT = 2
local PHASE_SEALED = 3

-- FactKind: how a driver fact changes the Grain table (append-fenced ARGV)
local KIND_OTHER = 0
local KIND_DISPATCHED = 1
local KIND_RETRIED = 2
local KIND_FAILED = 3
local KIND_REUSED = 4

-- PHASE_AFTER: the phase a driver fact of each kind leaves behind
local PHASE_AFTER = {[KIND_DISPATCHED] = PHASE_IN_FLIGHT, [KIND_RETRIED] = PHASE_READY, [KIND_FAILED] = PHASE_SEALED, [KIND_REUSED] = PHASE_SEALED}

-- CommitVerdict: the answers of commit-batch, one per report
local VERDICT_ACCEPTED = 1
local VERDICT_NOT_DISPATCHED = -1
local VERDICT_STALE = -2
local VERDICT_SEALED = -3
local VERDICT_BARRED = -4

-- The phase of a Grain entry (nil: no entry, the Grain is waiting as far as the store knows)
local function entry_phase(entry)
  if not entry then return nil end
  return string.byte(entry, 1) - 48
end

-- The generation of a Grain entry, as its decimal text (nil: no entry)
local function entry_generation(entry)
  if not entry then return nil end
  return string.match(entry, '^%d:(%d+)')
end
