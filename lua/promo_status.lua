-- promo_status.lua: pause or resume a promotion (`deductor promo pause|resume`) in one
-- step. Only `status` is written, so deductions and refunds made meanwhile by the
-- running service are kept (`promo set --force` would rewrite the whole hash).
--
-- KEYS[1] promotion  promo:{P}  hash
-- ARGV[1] status     "paused" | "active"
--
-- Reply: {result, previous}
--   result    "changed" | "unchanged" | "not_found" (nothing written)
--   previous  the stored status ("active" when the field is absent); "" when not found
--
-- Error replies (the first word is the code):
--   "BADARG <what>"                   a malformed argument; nothing read or written
--   "CORRUPT <key> <field>: <value>"  the key is not a hash, or its status is neither
--                                     active nor paused; nothing written

-- The helpers (fail, corrupt, read_hash, run) are lua/lib.lua's, prepended to this
-- script when it is loaded.

local function main()
  if #KEYS ~= 1 then fail('BADARG expected 1 key, got ' .. #KEYS) end
  if #ARGV ~= 1 then fail('BADARG expected 1 argument, got ' .. #ARGV) end
  local want = ARGV[1]
  if want ~= 'paused' and want ~= 'active' then fail('BADARG status: ' .. show(want)) end
  local key = KEYS[1]
  local h = read_hash(key)
  if not h then return { 'not_found', '' } end
  local was = h.status or 'active'
  if was ~= 'active' and was ~= 'paused' then corrupt(key, 'status', was) end
  if was == want then return { 'unchanged', was } end
  redis.call('HSET', key, 'status', want)
  return { 'changed', was }
end

return run(main)
