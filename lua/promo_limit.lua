-- promo_limit.lua: set or remove a promotion's per-customer limit (`deductor promo
-- limit`) while the service runs. Only `per_customer` is written. A limit counts only
-- the orders placed while it is in force (their records say counted=1, and only they
-- took and give back a slot of promo:{P}:used:{C}); orders placed without a limit
-- never count, so setting a limit later does not reach back.
--
-- KEYS[1] promotion  promo:{P}  hash
-- ARGV[1] per_customer  a canonical integer, or "" = no limit (the field is deleted)
--
-- Reply: {result, previous}
--   result    "set" | "removed" | "unchanged" | "not_found" (nothing written)
--   previous  the limit before, -1 = none (or not found)
--
-- Error replies (the first word is the code):
--   "BADARG <what>"                   a malformed argument; nothing read or written
--   "CORRUPT <key> <field>: <value>"  the stored per_customer is not a canonical
--                                     integer, or the key is not a hash; nothing written

-- The helpers (fail, canonical, read_hash, num_field, run) are lua/lib.lua's,
-- prepended to this script when it is loaded.

local function main()
  if #KEYS ~= 1 then fail('BADARG expected 1 key, got ' .. #KEYS) end
  if #ARGV ~= 1 then fail('BADARG expected 1 argument, got ' .. #ARGV) end
  local want = ARGV[1]
  if want ~= '' and not canonical(want) then fail('BADARG per_customer: ' .. show(want)) end
  local key = KEYS[1]
  local h = read_hash(key)
  if not h then return { 'not_found', -1 } end
  local was = num_field(h, key, 'per_customer')
  local previous = was or -1
  if want == '' then
    if was == nil then return { 'unchanged', previous } end
    redis.call('HDEL', key, 'per_customer')
    return { 'removed', previous }
  end
  if h.per_customer == want then return { 'unchanged', previous } end
  redis.call('HSET', key, 'per_customer', want)
  return { 'set', previous }
end

return run(main)
