-- deduct.lua: decide and apply one line of an OrderPlaced (CONTRACT.md section 3, "Deduct").
--
-- KEYS[1] promotion  promo:{P}                 hash: budget, stock, per_customer, status, starts_at, ends_at
-- KEYS[2] used       promo:{P}:used:{C}        string int: orders of C holding P
-- KEYS[3] record     promo:{P}:order:{O}       hash: state, event, budget, stock, budget0, stock0
-- KEYS[4] memo       promo:{P}:rejected:{E}    string: the rejection reason of event E, or
--                                               "accepted" when step 1 absorbed E into another
--                                               event's record (see step 1 below), or
--                                               "released" (see release.lua): then the reply is
--                                               rejected with reason "released", duplicate
--
-- ARGV[1] budget           canonical integer, amount to deduct
-- ARGV[2] stock            canonical integer, amount to deduct
-- ARGV[3] occurred_at      unix seconds (may be negative), judged against the window
-- ARGV[4] event_id         E
-- ARGV[5] record_ttl_secs  positive canonical integer
-- ARGV[6] refund_ttl_secs  positive canonical integer (TTL of the rejection memo)
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
--   "CORRUPT <key> <field>: <value>"  stored data breaks CONTRACT.md section 2; nothing written
--
-- Every argument and every stored value is validated before the first write, so the
-- script never has to undo a write. Unknown hash fields are ignored.

local MAX_DIGITS = 15 -- keeps every number exact in a Lua double

-- Numbers go to redis.call as exact decimal strings (Lua's tostring would
-- print 15-digit values in exponent notation).
local function int(n) return string.format('%d', n) end

local function fail(msg) error({ fail = msg }, 0) end

local function show(v)
  v = tostring(v)
  if #v > 64 then v = string.sub(v, 1, 64) .. '...' end
  return (string.gsub(v, '%c', '?'))
end

local function corrupt(key, field, value) fail('CORRUPT ' .. key .. ' ' .. field .. ': ' .. show(value)) end

local function canonical(s)
  return type(s) == 'string' and #s <= MAX_DIGITS and (s == '0' or string.find(s, '^[1-9][0-9]*$') ~= nil)
end

-- A canonical integer that may carry a leading '-' (never "-0").
local function signed(s)
  if type(s) ~= 'string' then return false end
  if string.sub(s, 1, 1) == '-' then
    local m = string.sub(s, 2)
    return m ~= '0' and canonical(m)
  end
  return canonical(s)
end

local function wrong_type(key, reply)
  if type(reply) == 'table' and reply.err then
    -- Only a wrong key type is corrupt data; any other error (an ACL refusal:
    -- NOPERM, OOM, ...) is passed on with its own code so the caller does not
    -- mistake a misconfiguration for corrupt promotions.
    if string.sub(reply.err, 1, 9) ~= 'WRONGTYPE' then fail(reply.err) end
    local t = redis.pcall('TYPE', key)
    corrupt(key, 'type', type(t) == 'table' and t.ok or reply.err)
  end
end

local function read_hash(key)
  local r = redis.pcall('HGETALL', key)
  wrong_type(key, r)
  if #r == 0 then return nil end
  local h = {}
  for i = 1, #r, 2 do h[r[i]] = r[i + 1] end
  return h
end

local function read_string(key)
  local r = redis.pcall('GET', key)
  wrong_type(key, r)
  if r == false then return nil end
  return r
end

-- An optional canonical field of a hash, as a number (nil when absent).
local function num_field(h, key, field)
  local v = h[field]
  if v == nil then return nil end
  if not canonical(v) then corrupt(key, field, v) end
  return tonumber(v)
end

local function read_promotion(key)
  local h = read_hash(key)
  if not h then return nil end
  local p = {
    budget = num_field(h, key, 'budget'),
    stock = num_field(h, key, 'stock'),
    per_customer = num_field(h, key, 'per_customer'),
    starts_at = num_field(h, key, 'starts_at'),
    ends_at = num_field(h, key, 'ends_at'),
    status = h.status or 'active',
  }
  if p.status ~= 'active' and p.status ~= 'paused' then corrupt(key, 'status', p.status) end
  return p
end

local function read_used(key)
  local v = read_string(key)
  if v == nil then return 0 end
  if not canonical(v) then corrupt(key, 'value', v) end
  return tonumber(v)
end

local function read_record(key)
  local h = read_hash(key)
  if not h then return nil end
  local r = { state = h.state, event = h.event }
  if r.state ~= 'deducted' and r.state ~= 'reverted' then corrupt(key, 'state', h.state or '(absent)') end
  for _, f in ipairs({ 'budget', 'stock', 'budget0', 'stock0' }) do
    local v = h[f]
    if not canonical(v) then corrupt(key, f, v or '(absent)') end
    r[f] = tonumber(v)
  end
  if r.budget > r.budget0 then corrupt(key, 'budget', h.budget) end
  if r.stock > r.stock0 then corrupt(key, 'stock', h.stock) end
  if r.state == 'deducted' and (r.event == nil or r.event == '') then corrupt(key, 'event', r.event or '(absent)') end
  return r
end

local REASONS = {
  budget_exceeded = true, stock_insufficient = true, user_limit_reached = true,
  promotion_not_found = true, promotion_inactive = true, order_reverted = true,
}

-- The memo's value when step 1 absorbed the event into another event's record.
local ABSORBED = 'accepted'
-- The memo's value when release.lua released this line for a rejected event.
local RELEASED = 'released'

local function read_memo(key)
  local v = read_string(key)
  if v ~= nil and v ~= ABSORBED and v ~= RELEASED and not REASONS[v] then corrupt(key, 'value', v) end
  return v
end

local function main()
  if #KEYS ~= 4 then fail('BADARG expected 4 keys, got ' .. #KEYS) end
  if #ARGV ~= 6 then fail('BADARG expected 6 arguments, got ' .. #ARGV) end
  local names = { 'budget', 'stock', 'occurred_at', 'event_id', 'record_ttl_secs', 'refund_ttl_secs' }
  for i, name in ipairs(names) do
    local ok
    if name == 'occurred_at' then
      ok = signed(ARGV[i])
    elseif name == 'event_id' then
      ok = #ARGV[i] >= 1 and #ARGV[i] <= 64 and string.find(ARGV[i], '^[A-Za-z0-9_.-]+$') ~= nil
    else
      ok = canonical(ARGV[i]) and not (name:find('ttl') and ARGV[i] == '0')
    end
    if not ok then fail('BADARG ' .. name .. ': ' .. show(ARGV[i])) end
  end
  local b, s, t, event = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
  local record_ttl, refund_ttl = ARGV[5], ARGV[6]
  local k_promo, k_used, k_record, k_memo = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

  -- Read and validate everything before deciding.
  local memo = read_memo(k_memo)
  local promo = read_promotion(k_promo)
  local used = read_used(k_used)
  local rec = read_record(k_record)

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

  -- 0. This event was decided before: repeat the decision. "accepted" is the memo of
  -- an event absorbed by step 1 into another event's record.
  -- "released": this event was rejected on another line and this line released
  -- (release.lua); a slower delivery must not deduct it afresh. The caller reads
  -- the event's stored reason from its other lines.
  if memo == RELEASED then return reply('rejected', RELEASED, 1, 0, 0) end
  if memo == ABSORBED then
    return reply('accepted', '', 1, rec and rec.budget0 or 0, rec and rec.stock0 or 0)
  end
  if memo then return reply('rejected', memo, 1, 0, 0) end
  -- 1./2. A record of this order: a deducted order stays deducted; a record reverted
  -- after this very event deducted it means the event was accepted (one decision per
  -- event; the project's change to step 2, see docs/contract.md); any other reverted
  -- record (refund tombstone, another event) rejects. When a new event of the order
  -- is absorbed into another event's record, that is remembered under its memo (TTL
  -- record_ttl), so that a replay after the order's refund still answers accepted.
  if rec then
    if rec.state == 'deducted' or rec.event == event then
      if rec.event ~= event then redis.call('SET', k_memo, ABSORBED, 'EX', record_ttl) end
      return reply('accepted', '', 1, rec.budget0, rec.stock0)
    end
    return reject('order_reverted')
  end
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

  -- 6. Write.
  if promo.budget then promo.budget = redis.call('HINCRBY', k_promo, 'budget', int(-b)) end
  if promo.stock then promo.stock = redis.call('HINCRBY', k_promo, 'stock', int(-s)) end
  if promo.per_customer then
    redis.call('INCR', k_used)
    redis.call('EXPIRE', k_used, record_ttl)
  end
  redis.call('HSET', k_record, 'state', 'deducted', 'event', event,
    'budget', ARGV[1], 'stock', ARGV[2], 'budget0', ARGV[1], 'stock0', ARGV[2])
  redis.call('EXPIRE', k_record, record_ttl)
  return reply('accepted', '', 0, b, s)
end

local ok, res = pcall(main)
if ok then return res end
if type(res) == 'table' and res.fail then return redis.error_reply(res.fail) end
error(res, 0)
