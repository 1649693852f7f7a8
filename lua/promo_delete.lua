-- promo_delete.lua: delete a promotion's hash (`deductor promo delete`), refusing in
-- the same step while its records still hold deductions. Its other keys (records,
-- memos, per-customer counters) stay until their TTLs: they keep replays and refunds
-- deciding as before (a refund of a deleted promotion returns nothing to it). The
-- incarnation counter promo:{P}:gen is kept, so a promotion created again under the
-- same id is a new incarnation.
--
-- KEYS[1] promotion  promo:{P}  hash
-- ARGV[1] mode  "check" = delete only when nothing is outstanding; "force" = delete
--
-- What is outstanding is derived from the hash: for each dimension with both a
-- remaining amount and initial_*, initial - remaining. When no dimension has both
-- (unlimited, or created before initial_* existed), "check" answers "unknown" and
-- writes nothing: the caller counts the `deducted` records with SCAN (a script cannot
-- scan) and calls again with "force" when there are none.
--
-- Reply: {result, outstanding_budget, outstanding_stock}
--   result  "deleted" | "not_found" | "outstanding" (nothing written) | "unknown" (nothing written)
--   outstanding_*  initial - remaining as a decimal string (negative when the data is off:
--                  also refused), "" where it cannot be derived
--
-- Error replies (the first word is the code):
--   "BADARG <what>"                   a malformed argument; nothing read or written
--   "CORRUPT <key> <field>: <value>"  a stored amount is not a canonical integer, or
--                                     the key is not a hash (check mode; nothing written)

-- The helpers (fail, read_hash, num_field, int, run) are lua/lib.lua's, prepended to this
-- script when it is loaded.

local function main()
  if #KEYS ~= 1 then fail('BADARG expected 1 key, got ' .. #KEYS) end
  if #ARGV ~= 1 then fail('BADARG expected 1 argument, got ' .. #ARGV) end
  local mode = ARGV[1]
  if mode ~= 'check' and mode ~= 'force' then fail('BADARG mode: ' .. show(mode)) end
  local key = KEYS[1]
  if mode == 'force' then
    -- Forced: whatever the hash holds, even corrupt data or another type.
    if redis.call('DEL', key) == 1 then return { 'deleted', '', '' } end
    return { 'not_found', '', '' }
  end
  local h = read_hash(key)
  if not h then return { 'not_found', '', '' } end
  local out = {}
  local known = false
  for _, name in ipairs({ 'budget', 'stock' }) do
    local rem = num_field(h, key, name)
    local init = num_field(h, key, 'initial_' .. name)
    if rem ~= nil and init ~= nil then
      out[name] = init - rem
      known = true
    end
  end
  local function text(v) if v == nil then return '' end return int(v) end
  local reply = { '', text(out.budget), text(out.stock) }
  if not known then reply[1] = 'unknown'
  elseif (out.budget or 0) ~= 0 or (out.stock or 0) ~= 0 then reply[1] = 'outstanding'
  else
    redis.call('DEL', key)
    reply[1] = 'deleted'
  end
  return reply
end

return run(main)
