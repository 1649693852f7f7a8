-- deduct.lua: decide and apply one line of an OrderPlaced (CONTRACT.md section 3, "Deduct").
--
-- KEYS[1] promotion  promo:{P}                 hash: budget, stock, per_customer, status, starts_at,
--                                               ends_at, initial_budget, initial_stock, gen
-- KEYS[2] used       promo:{P}:used:{C}        string int: counted orders of C holding P
-- KEYS[3] record     promo:{P}:order:{O}       string (lean layout, lib.lua; a hash of the previous
--                                               layout is read too): state, event, budget, stock,
--                                               budget0, stock0, customer, counted, gen, absorbed,
--                                               absorbed:<E>..., refund:<E>...
-- KEYS[4] memo       promo:{P}:rejected:{E}    string: the rejection reason of event E (including
--                                               corrupt_promotion), or "accepted" when step 1
--                                               absorbed E into another event's record, or
--                                               "released" (see release.lua): then the reply is
--                                               rejected with reason "released", duplicate
-- KEYS[5] index      promo:{P}:index:{D}       set (optional: a standalone server; absent on
--                                               a Redis Cluster): the order ids of P's records
--                                               created on day D (unix seconds / 86400), which
--                                               `audit P` reads instead of the whole keyspace
--
-- ARGV[1] budget           canonical integer, amount to deduct
-- ARGV[2] stock            canonical integer, amount to deduct
-- ARGV[3] occurred_at      unix seconds (may be negative), judged against the window
-- ARGV[4] event_id         E
-- ARGV[5] record_ttl_secs  positive canonical integer
-- ARGV[6] refund_ttl_secs  positive canonical integer (TTL of the rejection memo)
-- ARGV[7] customer_id      C (stored in the record: refunds and releases act on it)
-- ARGV[8] order_id         O (with KEYS[5] only): the member a new record adds to the index
-- ARGV[9] index_ttl_secs   positive canonical integer (with KEYS[5] only): the index's TTL is
--                          raised to it (never lowered) when a record is added, so the set
--                          outlives every record it lists (record_ttl_secs + one day)
--
-- Reply: {status, reason, duplicate, budget, stock, remaining_budget, remaining_stock}
--   status     "accepted" | "rejected"
--   reason     "" when accepted, else a contract reason
--   duplicate  1 when the decision was read back (memo or record), else 0
--   budget, stock  the line's amounts (as first deducted for a duplicate; 0 when rejected)
--   remaining_*    what the promotion has left after the script; -1 = unlimited or no promotion
--
-- Error replies (the first word is the code the caller matches on):
--   "BADARG <what>"                   a malformed argument: a caller bug, nothing read or written
--   "CORRUPT <key> <field>: <value>"  stored data breaks CONTRACT.md section 2. The decision is
--                                     remembered: "corrupt_promotion" is stored under the memo
--                                     (TTL refund_ttl), nothing else is written, so every later
--                                     delivery of E repeats the rejection (step 0) even after
--                                     the data is repaired. Only a corrupt memo itself cannot be
--                                     remembered (and then every delivery meets it again).
--
-- Every argument and every stored value is validated before the first write, so the
-- script never has to undo a write. Unknown hash fields are ignored.

-- The helpers (fail, canonical, read_promotion, read_record, REASONS, ...) are
-- lua/lib.lua's, prepended to this script when it is loaded.

local function read_memo(key)
  local v = read_string(key)
  if v ~= nil and v ~= ABSORBED and v ~= RELEASED and not REASONS[v] then corrupt(key, 'value', v) end
  return v
end

local function main()
  if #KEYS ~= 4 and #KEYS ~= 5 then fail('BADARG expected 4 or 5 keys, got ' .. #KEYS) end
  if #ARGV ~= #KEYS * 2 - 1 then
    fail('BADARG expected ' .. (#KEYS * 2 - 1) .. ' arguments with ' .. #KEYS .. ' keys, got ' .. #ARGV)
  end
  local names = { 'budget', 'stock', 'occurred_at', 'event_id', 'record_ttl_secs', 'refund_ttl_secs',
    'customer_id', 'order_id', 'index_ttl_secs' }
  for i = 1, #ARGV do
    local name, ok = names[i], nil
    if name == 'occurred_at' then
      ok = signed(ARGV[i])
    elseif name == 'event_id' or name == 'customer_id' or name == 'order_id' then
      ok = event_id(ARGV[i])
    else
      ok = canonical(ARGV[i]) and not (ARGV[i] == '0' and name:find('ttl'))
    end
    if not ok then fail('BADARG ' .. name .. ': ' .. show(ARGV[i])) end
  end
  local b, s, t, event = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
  local record_ttl, refund_ttl, customer = ARGV[5], ARGV[6], ARGV[7]
  local k_promo, k_used, k_record, k_memo = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

  -- 0. This event was decided before: repeat the decision, whatever the other keys
  -- hold now (corrupt data included). "accepted" is the memo of an event absorbed by
  -- step 1 into another event's record. "released": this event was rejected on
  -- another line and this line released (release.lua); a slower delivery must not
  -- deduct it afresh. The caller reads the event's stored reason from its other lines.
  local memo = read_memo(k_memo)
  if memo == RELEASED then return { 'rejected', RELEASED, 1, 0, 0, -1, -1 } end
  if memo and memo ~= ABSORBED then return { 'rejected', memo, 1, 0, 0, -1, -1 } end
  if memo == ABSORBED then
    -- Accepted before: the amounts are the record's (0 when it is gone, or now
    -- unreadable: corrupt data never turns this event's acceptance into a rejection).
    local r = lenient(read_record, k_record)
    local p = lenient(read_promotion, k_promo)
    return { 'accepted', '', 1, r and r.budget0 or 0, r and r.stock0 or 0,
      p and p.budget or -1, p and p.stock or -1 }
  end

  -- Read and validate everything else before deciding. Corrupt data is a decision
  -- too: it is remembered under the memo, so that every delivery of E repeats it.
  local function guarded(read) remembering_corrupt(k_memo, CORRUPT_REASON, refund_ttl, read) end
  local promo, used, rec
  guarded(function() rec = read_record(k_record) end)

  -- 1./2. A record of this order: a deducted order stays deducted; a record reverted
  -- after this very event deducted it means the event was accepted (one decision per
  -- event; the project's change to step 2, see docs/contract.md); any other reverted
  -- record (refund tombstone, another event) rejects. When a new event of the order
  -- is absorbed into another event's record, that is remembered under its memo (TTL
  -- record_ttl), and the first such event is noted in the record (`absorbed`; any
  -- further one as a field `absorbed:<E>`): if the
  -- record's own event is then rejected on another line (a zombie delivery of a
  -- multi-line order), release.lua hands the deduction over to the absorbed event
  -- instead of giving it back, so an accepted event never ends up holding nothing.
  -- The record decides before the promotion is read: corrupt promotion data never
  -- turns an accepted event into a rejection.
  if rec and (rec.state == 'deducted' or rec.event == event) then
    if rec.event ~= event then
      redis.call('SET', k_memo, ABSORBED, 'EX', record_ttl)
      if rec.state == 'deducted' and rec.absorbed == nil then
        rec.fields.absorbed = event
        write_record(k_record, rec.fields)
      elseif rec.state == 'deducted' and rec.absorbed ~= event and rec.fields['absorbed:' .. event] == nil then
        -- Every absorbed event is noted, numbered in the order they come, so that
        -- a chain (the first one released, then the record's own event) still
        -- hands the record on.
        local last = 0
        for f, v in pairs(rec.fields) do
          if string.sub(f, 1, 9) == 'absorbed:' and tonumber(v) > last then last = tonumber(v) end
        end
        rec.fields['absorbed:' .. event] = int(last + 1)
        write_record(k_record, rec.fields)
      end
    end
    local p = lenient(read_promotion, k_promo)
    return { 'accepted', '', 1, rec.budget0, rec.stock0, p and p.budget or -1, p and p.stock or -1 }
  end
  guarded(function()
    promo = read_promotion(k_promo)
    used = read_used(k_used) or 0
  end)

  local function remaining()
    if not promo then return -1, -1 end
    return promo.budget or -1, promo.stock or -1
  end
  local function reply(status, reason, dup, rb, rs)
    local left_b, left_s = remaining()
    return { status, reason, dup, rb, rs, left_b, left_s }
  end
  local function reject(reason)
    redis.call('SET', k_memo, reason, 'EX', refund_ttl)
    return reply('rejected', reason, 0, 0, 0)
  end

  if rec then return reject('order_reverted') end
  -- 3.
  if not promo then return reject('promotion_not_found') end
  -- 4. Business time against [starts_at, ends_at).
  if promo.status == 'paused'
    or (promo.starts_at and t < promo.starts_at)
    or (promo.ends_at and t >= promo.ends_at) then
    return reject('promotion_inactive')
  end
  -- 5. In this order; the first failing one is reported.
  if promo.budget and promo.budget < b then return reject('budget_exceeded') end
  if promo.stock and promo.stock < s then return reject('stock_insufficient') end
  if promo.per_customer and used >= promo.per_customer then return reject('user_limit_reached') end

  -- 6. Write. First the new record's order id in the day's index (lib.lua).
  index_record(KEYS[5], ARGV[8], ARGV[9], record_ttl, guarded)
  -- The record says whom it counted for and from which incarnation it took.
  if promo.budget then promo.budget = redis.call('HINCRBY', k_promo, 'budget', int(-b)) end
  if promo.stock then promo.stock = redis.call('HINCRBY', k_promo, 'stock', int(-s)) end
  local counted = '0'
  if promo.per_customer then
    -- The count read above plus one, with its TTL, in one command (as INCR and
    -- EXPIRE would leave it).
    redis.call('SET', k_used, int(used + 1), 'EX', record_ttl)
    counted = '1'
  end
  -- One SET for the whole record with its TTL (the lean layout of lib.lua),
  -- `gen` included when the promotion has one.
  redis.call('SET', k_record, new_record_value(event, ARGV[1], ARGV[2], customer, counted, promo.gen),
    'EX', record_ttl)
  return reply('accepted', '', 0, b, s)
end

return run(main)
