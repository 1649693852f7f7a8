-- release.lua: undo one line that event E deducted, when a later line of the same
-- multi-line order was rejected (CONTRACT.md section 3, all-or-nothing).
--
-- KEYS[1] promotion  promo:{P}            hash
-- KEYS[2] used       promo:{P}:used:{C}   string int
-- KEYS[3] record     promo:{P}:order:{O}  hash
-- KEYS[4] memo       promo:{P}:rejected:{E}  string (optional: with it, the line is marked)
--
-- ARGV[1] event_id         E: only a record that E deducted is released
-- ARGV[2] refund_ttl_secs  with KEYS[4] only: TTL of the mark
--
-- With KEYS[4] (a rejection, not corrupt data): the memo of this line is set to
-- "released" where it is absent or "accepted" (never over a reason), in the same
-- atomic step. A slower second delivery of E that reaches this line later then
-- repeats the event's decision instead of deducting the line afresh (deduct.lua
-- step 0; the project's change to the contract, see docs/contract.md).
--
-- Reply: {released}  1 when the record was `deducted` by E and has been released
--   (its outstanding budget/stock added back where the promotion and the field exist,
--   used decremented but never below 0, the record deleted), else 0 and nothing changes.
--   A record deducted by another event of the same order is never touched.
--
-- Error replies: "BADARG <what>", "CORRUPT <key> <field>: <value>" (nothing written).
-- Every argument and every stored value is validated before the first write.

-- The helpers (fail, canonical, read_promotion, read_record, REASONS, ...) are
-- lua/lib.lua's, prepended to this script when it is loaded.

local function main()
  if #KEYS ~= 3 and #KEYS ~= 4 then fail('BADARG expected 3 or 4 keys, got ' .. #KEYS) end
  local marking = #KEYS == 4
  local nargs = marking and 2 or 1
  if #ARGV ~= nargs then fail('BADARG expected ' .. nargs .. ' arguments, got ' .. #ARGV) end
  local event = ARGV[1]
  if not event_id(event) then
    fail('BADARG event_id: ' .. show(event))
  end
  if marking and (not canonical(ARGV[2]) or ARGV[2] == '0') then fail('BADARG refund_ttl_secs: ' .. show(ARGV[2])) end
  local k_promo, k_used, k_record = KEYS[1], KEYS[2], KEYS[3]

  local promo = read_promotion(k_promo)
  local used = read_used(k_used)
  local rec = read_record(k_record)
  local memo = nil
  if marking then
    memo = read_string(KEYS[4])
    if memo ~= nil and memo ~= ABSORBED and memo ~= RELEASED and not REASONS[memo] then
      corrupt(KEYS[4], 'value', memo)
    end
  end

  local released = 0
  if rec and rec.state == 'deducted' and rec.event == event then
    if promo and promo.budget then redis.call('HINCRBY', k_promo, 'budget', int(rec.budget)) end
    if promo and promo.stock then redis.call('HINCRBY', k_promo, 'stock', int(rec.stock)) end
    if used and used > 0 then redis.call('DECR', k_used) end
    redis.call('DEL', k_record)
    released = 1
  end
  if marking and (memo == nil or memo == ABSORBED) then
    redis.call('SET', KEYS[4], RELEASED, 'EX', ARGV[2])
  end
  return { released }
end

return run(main)
