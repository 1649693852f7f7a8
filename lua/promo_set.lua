-- promo_set.lua: create (or, forced, replace) a promotion hash in one step, so
-- that two operators can never both "create" the same promotion.
--
-- KEYS[1] promotion   promo:{P}      hash
-- KEYS[2] generation  promo:{P}:gen  string int: the last incarnation number of P (no TTL)
-- ARGV[1] force      "0" = refuse when it exists; "2" = replace an existing hash; "1" =
--                    replace it only when its records hold nothing: for each dimension
--                    with both a remaining amount and initial_*, initial - remaining
--                    must be 0 (checked here, in the same step as the write, so a
--                    deduction cannot land between the check and the replace)
-- ARGV[2..] field, value pairs of the new hash (at least one pair); an `indexed` field
--            is replaced by the replaced hash's own `indexed`, when it has one
--
-- Every hash written gets `gen`, a new incarnation number (INCR of KEYS[2], which a
-- delete of the hash leaves in place). Records store the `gen` they were deducted
-- from, and refunds give back only to the same incarnation: a replaced or re-created
-- promotion never gets back what was taken from the old one (docs/contract.md).
--
-- Reply: "created" | "replaced" | "exists" (not forced: nothing written) |
--   "outstanding" (mode "1" and the hash shows deductions outstanding: nothing written).
-- Error replies: "BADARG <what>".

if #KEYS ~= 2 then return redis.error_reply('BADARG expected 2 keys, got ' .. #KEYS) end
local force = ARGV[1]
if force ~= '0' and force ~= '1' and force ~= '2' then return redis.error_reply('BADARG force must be 0, 1 or 2') end
if #ARGV < 3 or #ARGV % 2 ~= 1 then return redis.error_reply('BADARG expected field/value pairs') end
for i = 2, #ARGV, 2 do
  if ARGV[i] == 'gen' then return redis.error_reply('BADARG gen is set by the script') end
end
local key = KEYS[1]
local exists = redis.call('EXISTS', key) == 1
if exists and force == '0' then return 'exists' end
if exists and force == '1' then
  if redis.call('TYPE', key).ok ~= 'hash' then return 'outstanding' end
  for _, f in ipairs({ 'budget', 'stock' }) do
    local left = redis.call('HGET', key, f)
    local init = redis.call('HGET', key, 'initial_' .. f)
    -- Compared as text: equal canonical numbers are equal strings.
    if left and init and left ~= init then return 'outstanding' end
  end
end
-- A replaced incarnation's `indexed` day stays when the new hash gets one: the
-- old incarnation's records are in the indexes since that day, and `audit`
-- reads from it on (docs/contract.md section 2).
local since = exists and redis.call('TYPE', key).ok == 'hash' and redis.call('HGET', key, 'indexed')
local gen = redis.call('INCR', KEYS[2])
if exists then redis.call('DEL', key) end
redis.call('HSET', key, 'gen', string.format('%d', gen), unpack(ARGV, 2))
if since and redis.call('HGET', key, 'indexed') then redis.call('HSET', key, 'indexed', since) end
if exists then return 'replaced' end
return 'created'
