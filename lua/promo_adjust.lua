-- promo_adjust.lua: add to or take from a promotion's budget and stock
-- (`deductor promo adjust`) while the service runs. Each adjusted dimension moves
-- its remaining amount and its initial_* amount by the same delta in one step, so
-- the ledger invariant (initial - remaining == outstanding, CONTRACT.md section 5)
-- keeps holding and deductions made meanwhile are kept.
--
-- KEYS[1] promotion  promo:{P}  hash: budget, stock, initial_budget, initial_stock, ...
-- ARGV[1] budget delta  a signed canonical integer ("-250", "1000"), or "" = leave it
-- ARGV[2] stock delta   the same, for stock (at least one of the two is given)
--
-- Reply: {result, field, budget, initial_budget, stock, initial_stock}
--   result  "adjusted"    both deltas applied
--           "not_found"   no such promotion
--           "unlimited"   `field` has no remaining amount (absent = unlimited): nothing to
--                         adjust; give the promotion a limit with `promo set --force`
--           "below_zero"  the delta would take `field` (or its initial_*) below 0
--           "above_max"   ... or above 999999999999999 (the scripts' exact-number bound)
--   field   "budget" | "stock" for a refusal, "" otherwise
--   budget, initial_budget, stock, initial_stock  the amounts after the script (as they
--           were when refused); -1 = absent
-- A refusal writes nothing, not even the other dimension's delta.
--
-- Error replies (the first word is the code):
--   "BADARG <what>"                   a malformed argument; nothing read or written
--   "CORRUPT <key> <field>: <value>"  a stored amount is not a canonical integer, or the
--                                     key is not a hash; nothing written

-- The helpers (fail, signed, read_hash, num_field, int, run, MAX_AMOUNT) are
-- lua/lib.lua's, prepended to this script when it is loaded.

local function main()
  if #KEYS ~= 1 then fail('BADARG expected 1 key, got ' .. #KEYS) end
  if #ARGV ~= 2 then fail('BADARG expected 2 arguments, got ' .. #ARGV) end
  local deltas = {}
  for i, name in ipairs({ 'budget', 'stock' }) do
    local v = ARGV[i]
    if v ~= '' then
      if not signed(v) then fail('BADARG ' .. name .. ' delta: ' .. show(v)) end
      deltas[name] = tonumber(v)
    end
  end
  if not deltas.budget and not deltas.stock then fail('BADARG no delta given') end
  local key = KEYS[1]
  local h = read_hash(key)
  if not h then return { 'not_found', '', -1, -1, -1, -1 } end
  local now = {
    budget = num_field(h, key, 'budget'),
    initial_budget = num_field(h, key, 'initial_budget'),
    stock = num_field(h, key, 'stock'),
    initial_stock = num_field(h, key, 'initial_stock'),
  }
  local function reply(result, field)
    return { result, field, now.budget or -1, now.initial_budget or -1, now.stock or -1, now.initial_stock or -1 }
  end
  -- Decide both dimensions before the first write.
  local writes = {}
  for _, name in ipairs({ 'budget', 'stock' }) do
    local d = deltas[name]
    if d then
      if now[name] == nil then return reply('unlimited', name) end
      for _, f in ipairs({ name, 'initial_' .. name }) do
        -- initial_* is moved when present (promotions created before it existed lack it).
        if now[f] ~= nil then
          local v = now[f] + d
          if v < 0 then return reply('below_zero', name) end
          if v > MAX_AMOUNT then return reply('above_max', name) end
          writes[#writes + 1] = { f, v }
        end
      end
    end
  end
  for _, w in ipairs(writes) do
    redis.call('HSET', key, w[1], int(w[2]))
    now[w[1]] = w[2]
  end
  return reply('adjusted', '')
end

return run(main)
