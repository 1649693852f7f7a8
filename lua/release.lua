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

local MAX_DIGITS = 15

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
  if v == nil then return nil end
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

local MEMOS = {
  accepted = true, released = true,
  budget_exceeded = true, stock_insufficient = true, user_limit_reached = true,
  promotion_not_found = true, promotion_inactive = true, order_reverted = true,
}

local function main()
  if #KEYS ~= 3 and #KEYS ~= 4 then fail('BADARG expected 3 or 4 keys, got ' .. #KEYS) end
  local marking = #KEYS == 4
  local nargs = marking and 2 or 1
  if #ARGV ~= nargs then fail('BADARG expected ' .. nargs .. ' arguments, got ' .. #ARGV) end
  local event = ARGV[1]
  if #event < 1 or #event > 64 or string.find(event, '^[A-Za-z0-9_.-]+$') == nil then
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
    if memo ~= nil and not MEMOS[memo] then corrupt(KEYS[4], 'value', memo) end
  end

  local released = 0
  if rec and rec.state == 'deducted' and rec.event == event then
    if promo and promo.budget then redis.call('HINCRBY', k_promo, 'budget', int(rec.budget)) end
    if promo and promo.stock then redis.call('HINCRBY', k_promo, 'stock', int(rec.stock)) end
    if used and used > 0 then redis.call('DECR', k_used) end
    redis.call('DEL', k_record)
    released = 1
  end
  if marking and (memo == nil or memo == 'accepted') then
    redis.call('SET', KEYS[4], 'released', 'EX', ARGV[2])
  end
  return { released }
end

local ok, res = pcall(main)
if ok then return res end
if type(res) == 'table' and res.fail then return redis.error_reply(res.fail) end
error(res, 0)
