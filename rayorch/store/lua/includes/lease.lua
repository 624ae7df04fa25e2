--[[ includes/lease.lua: the lease fence shared by acquire, renew and append.

A lease value (live lease key, with the TTL) and a holder value (the last acquisition,
kept without a TTL) read "epoch|token|driver"; the token is unique per acquisition.
A value written before tokens existed reads "epoch|driver" (token "").
]]

-- epoch (number), token, driver of a lease or holder value
local function parse_holder(value)
  local e, t, d = string.match(value, '^(%d+)|(%x*)|(.*)$')
  if e then return tonumber(e), t, d end
  e, d = string.match(value, '^(%d+)|(.*)$')
  return tonumber(e), '', d
end

-- The shard's epoch counter never falls below an epoch a driver presents: after a
-- restore from an older snapshot, the next new holder numbers above every epoch seen.
local function raise_epoch_counter(epochkey, epoch)
  if epoch > tonumber(redis.call('GET', epochkey) or '0') then
    redis.call('SET', epochkey, epoch)
  end
end

-- Is (epoch, token, driver) the holder recorded in value? An empty token matches any
-- (the caller did not acquire the lease through this client: epoch and driver only).
local function same_holder(value, epoch, token, driver)
  local e, t, d = parse_holder(value)
  return e == epoch and d == driver and (token == '' or t == token)
end

-- nil when (epoch, token, driver) holds the live lease; otherwise the refusal:
--   {-10}          expired or released, and nobody held the shard since
--   {-11, e, d}    continued (or held now) by driver d with epoch e
--   {-14, e, d}    the store has no record of this epoch: restored from an older state
local function fence(leasekey, holderkey, epochkey, epoch, token, driver)
  local held = redis.call('GET', leasekey)
  if held and same_holder(held, epoch, token, driver) then return nil end
  local last = held or redis.call('GET', holderkey)
  local e, d = tonumber(redis.call('GET', epochkey) or '0'), ''
  local mine = e == epoch   -- no holder record (a run from before it existed): the counter
  if last then
    local _
    e, _, d = parse_holder(last)
    mine = same_holder(last, epoch, token, driver)
  end
  raise_epoch_counter(epochkey, epoch)
  if not held and mine then return {-10} end
  if e < epoch then return {-14, e, d} end
  return {-11, e, d}
end
