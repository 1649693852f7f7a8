-- rollback.lua: apply one line of an OrderRefunded (CONTRACT.md section 3, "Rollback").
--
-- KEYS[1] promotion  promo:{P}               hash: budget, stock, initial_budget, initial_stock, gen
-- KEYS[2] used       promo:{P}:used:{C}      string int (C = ARGV[6])
-- KEYS[3] record     promo:{P}:order:{O}     string (lean layout of lib.lua; or a hash of the previous
--                                             one): state, event, budget, stock, budget0, stock0,
--                                             customer, counted, gen, refund:<E>...
-- KEYS[4] memo       promo:{P}:refund:{E}    string: "rejected corrupt_promotion" when this line met
--                                             corrupt data (TTL refund_ttl), or a result an older
--                                             version stored here
-- KEYS[5] index      promo:{P}:index:{D}     set (optional, as in deduct.lua: a standalone server):
--                                             a new tombstone's order id is added to it
--
-- ARGV[1] budget           canonical integer to return, or "" = everything outstanding
-- ARGV[2] stock            canonical integer to return, or "" = everything outstanding
-- ARGV[3] record_ttl_secs  positive: TTL of a tombstone record
-- ARGV[4] refund_ttl_secs  positive: TTL of a corrupt_promotion memo
-- ARGV[5] event_id         E, the refund event
-- ARGV[6] customer_id      C: the customer whose `used` counter KEYS[2] is
-- ARGV[7] order_id         O (with KEYS[5] only): the member a new tombstone adds to the index
-- ARGV[8] index_ttl_secs   positive (with KEYS[5] only): as deduct.lua's
--
-- Reply: {status, reason, duplicate, budget_returned, stock_returned, remaining_budget, remaining_stock}
--   status     "applied" | "rejected" | "customer"
--   reason     "" when applied; no_deduction | already_reverted | exceeds_deducted |
--              corrupt_promotion (read back) when
--              rejected; for "customer": the record's customer, which is not C. Nothing
--              was written: the caller calls again with that customer's KEYS[2] and ARGV[6]
--              (refunds act on the customer the deduction counted for, never on the one
--              the refund event names)
--   duplicate  1 when the result was read back, else 0
--   remaining_*  what the promotion has left after the script; -1 = unlimited or no promotion
--
-- The result of every decision is stored in the record as field "refund:<E>" ("applied <b>
-- <s>" or "rejected <reason>"), so a redelivery returns the same result for as long as the
-- record exists (a refund of an order without a record leaves a tombstone record holding it).
-- A refund gives back to the promotion only what was taken from its current incarnation
-- (record `gen` = promotion `gen`), never past initial_*.
--
-- Error replies: "BADARG <what>", "CORRUPT <key> <field>: <value>": nothing written but the
-- memo "rejected corrupt_promotion" (unless the memo itself is what is corrupt).
-- Every argument and every stored value is validated before the first write.

-- The helpers (fail, canonical, read_promotion, read_record, ...) are
-- lua/lib.lua's, prepended to this script when it is loaded.

local REFUND_REASONS = {
  no_deduction = true, already_reverted = true, exceeds_deducted = true, corrupt_promotion = true,
}

-- A stored result: {status, reason, budget, stock}.
local function parse_result(key, field, v)
  local b, s = string.match(v, '^applied ([^ ]+) ([^ ]+)$')
  if b then
    if not canonical(b) or not canonical(s) then corrupt(key, field, v) end
    return { 'applied', '', tonumber(b), tonumber(s) }
  end
  local reason = string.match(v, '^rejected ([a-z_]+)$')
  if not reason or not REFUND_REASONS[reason] then corrupt(key, field, v) end
  return { 'rejected', reason, 0, 0 }
end

local function main()
  if #KEYS ~= 4 and #KEYS ~= 5 then fail('BADARG expected 4 or 5 keys, got ' .. #KEYS) end
  if #ARGV ~= #KEYS * 2 - 2 then
    fail('BADARG expected ' .. (#KEYS * 2 - 2) .. ' arguments with ' .. #KEYS .. ' keys, got ' .. #ARGV)
  end
  local names = { 'budget', 'stock', 'record_ttl_secs', 'refund_ttl_secs', 'event_id', 'customer_id',
    'order_id', 'index_ttl_secs' }
  for i = 1, #ARGV do
    local name, v = names[i], ARGV[i]
    local ok
    if i <= 2 then ok = v == '' or canonical(v)
    elseif i <= 4 or i == 8 then ok = canonical(v) and v ~= '0'
    else ok = event_id(v) end
    if not ok then fail('BADARG ' .. name .. ': ' .. show(v)) end
  end
  local record_ttl, refund_ttl, event, customer = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
  local k_promo, k_used, k_record, k_memo = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  local field = 'refund:' .. event

  -- 1. This event's line was decided before: return the stored result, whatever
  -- the other keys hold now. The memo key holds a corrupt_promotion rejection (or a
  -- result of an older version); the record holds every other result.
  local memo = read_string(k_memo)
  if memo ~= nil then
    memo = parse_result(k_memo, 'value', memo)
    return { memo[1], memo[2], 1, memo[3], memo[4], -1, -1 }
  end
  -- Corrupt data is a decision too: remembered under the memo key (TTL refund_ttl),
  -- so that every delivery of E repeats it even after the data is repaired.
  local function guarded(read) remembering_corrupt(k_memo, 'rejected ' .. CORRUPT_REASON, refund_ttl, read) end
  local rec, stored, promo, used
  guarded(function()
    rec = read_record(k_record)
    stored = rec and rec.fields[field]
    if stored ~= nil then stored = parse_result(k_record, field, stored) end
  end)
  if stored then
    local p = lenient(read_promotion, k_promo)
    return { stored[1], stored[2], 1, stored[3], stored[4], p and p.budget or -1, p and p.stock or -1 }
  end
  guarded(function()
    promo = read_promotion(k_promo)
    used = read_used(k_used)
  end)

  local function reply(status, reason, dup, rb, rs)
    local left_b, left_s = -1, -1
    if promo then left_b, left_s = promo.budget or -1, promo.stock or -1 end
    return { status, reason, dup, rb, rs, left_b, left_s }
  end
  -- The record's field table gets this event's result; written once, keeping the
  -- record's TTL (ttl nil) or, for a new tombstone, with record_ttl.
  local function reject(reason, ttl)
    rec.fields[field] = 'rejected ' .. reason
    write_record(k_record, rec.fields, ttl)
    return reply('rejected', reason, 0, 0, 0)
  end

  -- 2. Nothing deducted: leave a tombstone (holding this result) so that a late
  -- placement of this order is rejected order_reverted instead of deducted.
  if not rec then
    index_record(KEYS[5], ARGV[7], ARGV[8], record_ttl, guarded)
    rec = { fields = { state = 'reverted', budget = '0', stock = '0', budget0 = '0', stock0 = '0' } }
    return reject('no_deduction', record_ttl)
  end
  if rec.state == 'reverted' then return reject('already_reverted') end
  -- The deduction counted for another customer than the event names: the caller
  -- repeats the call with that customer's counter (nothing written here).
  if rec.customer ~= nil and rec.customer ~= customer then
    return reply('customer', rec.customer, 0, 0, 0)
  end
  -- 3.
  local b = ARGV[1] == '' and rec.budget or tonumber(ARGV[1])
  local s = ARGV[2] == '' and rec.stock or tonumber(ARGV[2])
  if b > rec.budget or s > rec.stock then return reject('exceeds_deducted') end

  -- 4. Write. A deleted promotion (or an unlimited dimension) is never re-created, and
  -- another incarnation of the promotion gets nothing back.
  if same_incarnation(promo, rec) then
    credit(k_promo, promo, 'budget', b)
    credit(k_promo, promo, 'stock', s)
  end
  local left_b, left_s = rec.budget - b, rec.stock - s
  local h = rec.fields
  h.budget, h.stock, h[field] = int(left_b), int(left_s), 'applied ' .. int(b) .. ' ' .. int(s)
  if left_b == 0 and left_s == 0 then
    h.state = 'reverted'
    if rec.counted ~= false and used and used > 0 then redis.call('DECR', k_used) end
  end
  write_record(k_record, h)
  return reply('applied', '', 0, b, s)
end

return run(main)
