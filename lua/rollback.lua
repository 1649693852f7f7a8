-- rollback.lua: apply one line of an OrderRefunded (CONTRACT.md section 3, "Rollback").
--
-- KEYS[1] promotion  promo:{P}               hash: budget, stock (other fields ignored)
-- KEYS[2] used       promo:{P}:used:{C}      string int
-- KEYS[3] record     promo:{P}:order:{O}     hash: state, event, budget, stock, budget0, stock0
-- KEYS[4] memo       promo:{P}:refund:{E}    string: this line's result, for replays
--
-- ARGV[1] budget           canonical integer to return, or "" = everything outstanding
-- ARGV[2] stock            canonical integer to return, or "" = everything outstanding
-- ARGV[3] record_ttl_secs  positive: TTL of a tombstone record
-- ARGV[4] refund_ttl_secs  positive: TTL of the stored result
--
-- Reply: {status, reason, duplicate, budget_returned, stock_returned, remaining_budget, remaining_stock}
--   status     "applied" | "rejected"
--   reason     "" when applied, else no_deduction | already_reverted | exceeds_deducted
--   duplicate  1 when the result was read back from the memo, else 0
--   remaining_*  what the promotion has left after the script; -1 = unlimited or no promotion
--
-- The result of every decision is stored under the memo key ("applied <b> <s>" or
-- "rejected <reason>", TTL refund_ttl) so that a replay returns the same result.
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

local REFUND_REASONS = { no_deduction = true, already_reverted = true, exceeds_deducted = true }

-- A stored result: {status, reason, budget, stock}.
local function read_memo(key)
  local v = read_string(key)
  if v == nil then return nil end
  local b, s = string.match(v, '^applied ([^ ]+) ([^ ]+)$')
  if b then
    if not canonical(b) or not canonical(s) then corrupt(key, 'value', v) end
    return { 'applied', '', tonumber(b), tonumber(s) }
  end
  local reason = string.match(v, '^rejected ([a-z_]+)$')
  if not reason or not REFUND_REASONS[reason] then corrupt(key, 'value', v) end
  return { 'rejected', reason, 0, 0 }
end

local function main()
  if #KEYS ~= 4 then fail('BADARG expected 4 keys, got ' .. #KEYS) end
  if #ARGV ~= 4 then fail('BADARG expected 4 arguments, got ' .. #ARGV) end
  local names = { 'budget', 'stock', 'record_ttl_secs', 'refund_ttl_secs' }
  for i, name in ipairs(names) do
    local v = ARGV[i]
    local ok
    if i <= 2 then ok = v == '' or canonical(v) else ok = canonical(v) and v ~= '0' end
    if not ok then fail('BADARG ' .. name .. ': ' .. show(v)) end
  end
  local record_ttl, refund_ttl = ARGV[3], ARGV[4]
  local k_promo, k_used, k_record, k_memo = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

  -- Read and validate everything before deciding.
  local memo = read_memo(k_memo)
  local promo = read_promotion(k_promo)
  local used = read_used(k_used)
  local rec = read_record(k_record)

  local function reply(status, reason, dup, rb, rs)
    local left_b, left_s = -1, -1
    if promo then left_b, left_s = promo.budget or -1, promo.stock or -1 end
    return { status, reason, dup, rb, rs, left_b, left_s }
  end
  local function reject(reason)
    redis.call('SET', k_memo, 'rejected ' .. reason, 'EX', refund_ttl)
    return reply('rejected', reason, 0, 0, 0)
  end

  -- 1. This event's line was decided before: return the stored result.
  if memo then return reply(memo[1], memo[2], 1, memo[3], memo[4]) end
  -- 2. Nothing deducted: leave a tombstone so that a late placement of this
  -- order is rejected order_reverted instead of deducted.
  if not rec then
    redis.call('HSET', k_record, 'state', 'reverted', 'budget', '0', 'stock', '0', 'budget0', '0', 'stock0', '0')
    redis.call('EXPIRE', k_record, record_ttl)
    return reject('no_deduction')
  end
  if rec.state == 'reverted' then return reject('already_reverted') end
  -- 3.
  local b = ARGV[1] == '' and rec.budget or tonumber(ARGV[1])
  local s = ARGV[2] == '' and rec.stock or tonumber(ARGV[2])
  if b > rec.budget or s > rec.stock then return reject('exceeds_deducted') end

  -- 4. Write. A deleted promotion (or an unlimited dimension) is never re-created.
  if promo and promo.budget then promo.budget = redis.call('HINCRBY', k_promo, 'budget', int(b)) end
  if promo and promo.stock then promo.stock = redis.call('HINCRBY', k_promo, 'stock', int(s)) end
  local left_b, left_s = rec.budget - b, rec.stock - s
  redis.call('HSET', k_record, 'budget', int(left_b), 'stock', int(left_s))
  if left_b == 0 and left_s == 0 then
    redis.call('HSET', k_record, 'state', 'reverted')
    if used and used > 0 then redis.call('DECR', k_used) end
  end
  redis.call('SET', k_memo, 'applied ' .. int(b) .. ' ' .. int(s), 'EX', refund_ttl)
  return reply('applied', '', 0, b, s)
end

local ok, res = pcall(main)
if ok then return res end
if type(res) == 'table' and res.fail then return redis.error_reply(res.fail) end
error(res, 0)
