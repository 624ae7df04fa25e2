--[[ open-run-1.lua: create a run's description, or check a reopen matches it.

KEYS[1]  run meta hash  fingerprint, shards, micro_batch, plan, config, created_ts,
                        grain_table

ARGV[1] fingerprint  ARGV[2] shards  ARGV[3] micro_batch  ARGV[4] plan (JSON)
ARGV[5] config (JSON)  ARGV[6] created_ts
ARGV[7] grain_table: how the run keeps its Grain table (rayorch/store/keys.py), written
        only when the run is created: a run created before the field keeps its one hash

Returns: {1}                               created
         {2}                               existed with the same fingerprint and shards
         {-30, stored_fingerprint}         existed with another plan fingerprint
         {-31, stored_shards, stored_mb}   existed with another shards / micro_batch
Appends: nothing.
]]
local meta = KEYS[1]
local stored = redis.call('HMGET', meta, 'fingerprint', 'shards', 'micro_batch')
if stored[1] then
  if stored[1] ~= ARGV[1] then return {-30, stored[1]} end
  if stored[2] ~= ARGV[2] or stored[3] ~= ARGV[3] then return {-31, stored[2], stored[3]} end
  return {2}
end
redis.call('HSET', meta, 'fingerprint', ARGV[1], 'shards', ARGV[2], 'micro_batch', ARGV[3],
  'plan', ARGV[4], 'config', ARGV[5], 'created_ts', ARGV[6], 'grain_table', ARGV[7])
return {1}
