-- release.lua: undo one line that event E deducted, when another line of the same
-- multi-line order was rejected (CONTRACT.md section 3, all-or-nothing).
--
-- KEYS[1] promotion  promo:{P}            hash
-- KEYS[2] used       promo:{P}:used:{C}   string int (C: the record's customer)
-- KEYS[3] record     promo:{P}:order:{O}  string (lean layout of lib.lua; or a hash of the previous one)
-- KEYS[4] memo       promo:{P}:rejected:{E}  string: the line is marked here
--
-- ARGV[1] event_id         E: only a record that E deducted is released
-- ARGV[2] refund_ttl_secs  TTL of the mark
-- ARGV[3] customer_id      C: the used counter is only touched when the record
--                          counted for C (or is an older record without a customer);
--                          a record E deducted that counted another customer's slot
--                          (E holds it after a hand-over) is answered {-1, customer}
--
-- The memo of this line is set to "released" where it is absent or "accepted" (never
-- over a reason), in the same atomic step. A slower second delivery of E that reaches
-- this line later then repeats the event's decision instead of deducting the line
-- afresh (deduct.lua step 0; the project's change to the contract, see docs/contract.md).
--
-- Reply: {released}
--   1  the record was `deducted` by E and has been released: its outstanding
--      budget/stock added back where the promotion (of the same incarnation, `gen`) and
--      the field exist, never past initial_*; used decremented (never below 0) when the
--      record counted a per-customer slot; the record deleted, or, when it holds refund
--      results, kept as a reverted tombstone (nothing outstanding) so that those refunds
--      still repeat their results.
--   0  nothing was given back: no record of E (when E was only absorbed into another
--      event's record, its note `absorbed` = E or `absorbed:E` is removed, and the first
--      `absorbed:<E2>` takes the place of `absorbed`), or another event of the order was
--      absorbed into the record (deduct.lua step 1) and answered accepted, so the
--      deduction is handed over to that event (`event` := absorbed, else the first
--      `absorbed:<E2>`; the next further one becomes `absorbed`) and stays held.
--
--  {-1, customer}  nothing written: the record is E's, counted a per-customer slot,
--      and names another customer than C (a deduction handed over to E from an event
--      of another customer); call again with that customer as C (and its used key
--      as the second key), so that the slot goes back to the customer it counted for.
--
-- Error replies: "BADARG <what>", "CORRUPT <key> <field>: <value>" (nothing written).
-- Every argument and every stored value is validated before the first write.

-- The helpers (fail, canonical, read_promotion, read_record, REASONS, ...) are
-- lua/lib.lua's, prepended to this script when it is loaded.

local function main()
  if #KEYS ~= 4 then fail('BADARG expected 4 keys, got ' .. #KEYS) end
  if #ARGV ~= 3 then fail('BADARG expected 3 arguments, got ' .. #ARGV) end
  local event, ttl, customer = ARGV[1], ARGV[2], ARGV[3]
  if not event_id(event) then fail('BADARG event_id: ' .. show(event)) end
  if not canonical(ttl) or ttl == '0' then fail('BADARG refund_ttl_secs: ' .. show(ttl)) end
  if not event_id(customer) then fail('BADARG customer_id: ' .. show(customer)) end
  local k_promo, k_used, k_record, k_memo = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

  local promo = read_promotion(k_promo)
  local used = read_used(k_used)
  local rec = read_record(k_record)
  local memo = read_string(k_memo)
  if memo ~= nil and memo ~= ABSORBED and memo ~= RELEASED and not REASONS[memo] then
    corrupt(k_memo, 'value', memo)
  end

  local released = 0
  local changed = false -- the record's field table was changed (write it back)
  if rec and rec.state == 'deducted' and rec.event == event and not rec.absorbed
    and #further_absorbed(rec) == 0 and rec.counted ~= false
    and rec.customer ~= nil and rec.customer ~= customer then
    return { -1, rec.customer }
  end
  -- The record's absorbed events after this release: E is no longer one (it is
  -- rejected: it holds nothing); when E owns the record and another event was
  -- absorbed into it (deduct.lua step 1, answered accepted), the deduction is
  -- handed over to the noted one, else the first further one; then the first
  -- further one fills an empty note.
  local heir
  if rec then
    local noted, more = rec.absorbed, further_absorbed(rec)
    for i = #more, 1, -1 do
      if more[i] == event then table.remove(more, i) end
    end
    if noted == event then noted = nil end
    if rec.state == 'deducted' and rec.event == event then
      if noted ~= nil then
        heir, noted = noted, nil
      else
        heir = table.remove(more, 1)
      end
    end
    if noted == nil then noted = table.remove(more, 1) end
    -- The changes go into the record's field table, written once below.
    local h = rec.fields
    if heir then h.event = heir end
    if noted ~= rec.absorbed then h.absorbed = noted end
    local kept = {}
    for _, e in ipairs(more) do kept[e] = true end
    local drop = {}
    for f in pairs(h) do
      if string.sub(f, 1, 9) == 'absorbed:' and not kept[string.sub(f, 10)] then drop[#drop + 1] = f end
    end
    for _, f in ipairs(drop) do h[f] = nil end
    changed = heir ~= nil or noted ~= rec.absorbed or #drop > 0
  end
  if rec and rec.state == 'deducted' and rec.event == event and not heir then
    do
      if same_incarnation(promo, rec) then
        credit(k_promo, promo, 'budget', rec.budget)
        credit(k_promo, promo, 'stock', rec.stock)
      end
      local mine = rec.customer == nil or rec.customer == customer
      if mine and rec.counted ~= false and used and used > 0 then redis.call('DECR', k_used) end
      local refunded = false
      for f in pairs(rec.fields) do
        if string.sub(f, 1, 7) == 'refund:' then refunded = true end
      end
      if refunded then
        local h = rec.fields
        h.state, h.budget, h.stock, h.event = 'reverted', '0', '0', nil
        changed = true
      else
        redis.call('DEL', k_record)
        changed = false
      end
      released = 1
    end
  end
  if changed then write_record(k_record, rec.fields) end
  if memo == nil or memo == ABSORBED then
    redis.call('SET', k_memo, RELEASED, 'EX', ttl)
  end
  return { released }
end

return run(main)
