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

-- The helpers (fail, canonical, read_promotion, read_record, ...) are
-- lua/lib.lua's, prepended to this script when it is loaded.

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

return run(main)
