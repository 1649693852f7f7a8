-- promo_set.lua: create (or, forced, replace) a promotion hash in one step, so
-- that two operators can never both "create" the same promotion.
--
-- KEYS[1] promotion  promo:{P}  hash
-- ARGV[1] force      "1" = replace an existing hash, "0" = refuse when it exists
-- ARGV[2..] field, value pairs of the new hash (at least one pair)
--
-- Reply: "created" | "replaced" | "exists" (not forced: nothing written).
-- Error replies: "BADARG <what>".

if #KEYS ~= 1 then return redis.error_reply('BADARG expected 1 key, got ' .. #KEYS) end
local force = ARGV[1]
if force ~= '0' and force ~= '1' then return redis.error_reply('BADARG force must be 0 or 1') end
if #ARGV < 3 or #ARGV % 2 ~= 1 then return redis.error_reply('BADARG expected field/value pairs') end
local key = KEYS[1]
local exists = redis.call('EXISTS', key) == 1
if exists and force == '0' then return 'exists' end
if exists then redis.call('DEL', key) end
redis.call('HSET', key, unpack(ARGV, 2))
if exists then return 'replaced' end
return 'created'
