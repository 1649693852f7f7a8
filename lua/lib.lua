-- lib.lua: the helpers every deductor script shares. Not a script of its own:
-- src/ledger/scripts.rs prepends it to deduct.lua, release.lua, rollback.lua and
-- memo.lua at compile time (Redis scripts cannot load one another), so the script
-- Redis runs, and whose SHA1 EVALSHA names, is this file followed by the script.
--
-- Errors: a helper that finds a bad argument or corrupt data calls fail(msg); the
-- script's main() runs under run(), which turns that into the error reply `msg`
-- (first word: the code the caller matches on). Every check runs before the first
-- write, so a failure never leaves a partial write.
--
-- In front of lua/bucket.lua this file is cut down with it, per operation, to
-- the definitions the operation names (src/ledger/scripts.rs
-- `specialize_bucket`): keep the layout lua/bucket.lua's header describes.

local MAX_DIGITS = 15 -- keeps every number exact in a Lua double
local MAX_AMOUNT = 999999999999999 -- the largest canonical value

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

-- A canonical non-negative integer string: no sign, no leading zero, no
-- exponent, no blanks, at most MAX_DIGITS digits (never Lua's tonumber, which
-- takes "0x10", "1e3", " 5 ", "nan" and "inf").
local find = string.find -- (a local: each call of a script's hot path saves two table reads)
local function canonical(s)
  return type(s) == 'string' and #s <= MAX_DIGITS and (s == '0' or find(s, '^[1-9][0-9]*$') ~= nil)
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

-- An event id as CONTRACT.md section 1 allows it (so also a customer, order
-- or promotion id).
local EVENT_ID = '^[A-Za-z0-9_.-]+$'
local function event_id(s)
  return type(s) == 'string' and #s >= 1 and #s <= 64 and find(s, EVENT_ID) ~= nil
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

-- The numeric fields of a promotion hash, in the order read_promotion checks them.
local PROMOTION_NUMBERS = { 'budget', 'stock', 'per_customer', 'starts_at', 'ends_at', 'initial_budget',
  'initial_stock' }
local IS_PROMOTION_NUMBER = { budget = true, stock = true, per_customer = true, starts_at = true, ends_at = true,
  initial_budget = true, initial_stock = true }

-- promo:{P}: nil when absent; unknown fields are ignored. (read_hash and
-- num_field written out: this runs for every line of a batch spread over many
-- promotions. The table is made at its full size, the numbers checked in the
-- order above, so the first corrupt one is the one named.)
local function read_promotion(key)
  local r = redis.pcall('HGETALL', key)
  wrong_type(key, r)
  if #r == 0 then return nil end
  local p = { budget = nil, stock = nil, per_customer = nil, starts_at = nil, ends_at = nil,
    initial_budget = nil, initial_stock = nil, status = 'active', gen = nil }
  for i = 1, #r, 2 do
    local f = r[i]
    if IS_PROMOTION_NUMBER[f] or f == 'status' or f == 'gen' then
      p[f] = r[i + 1]
    elseif f == 'buckets' then
      -- A bucketed promotion's directory (docs/contract.md section 2b): its units
      -- are in its buckets, which lua/bucket.lua serves. Nothing is written; the
      -- service learns the promotion is bucketed and walks its buckets instead.
      fail('BUCKETED ' .. key)
    end
  end
  for i = 1, 7 do
    local field = PROMOTION_NUMBERS[i]
    local v = p[field]
    if v ~= nil then
      if #v > MAX_DIGITS or (v ~= '0' and find(v, '^[1-9][0-9]*$') == nil) then corrupt(key, field, v) end
      p[field] = tonumber(v)
    end
  end
  -- The incarnation (promo_set.lua) is kept as the stored string, nil when absent.
  if p.gen ~= nil and not canonical(p.gen) then corrupt(key, 'gen', p.gen) end
  if p.status ~= 'active' and p.status ~= 'paused' then corrupt(key, 'status', p.status) end
  return p
end

-- read_promotion through `kept` (key -> the promotion a batch read before in this
-- call, false: none): true and the promotion (nil: none), or false when the read
-- failed (not kept). For a batch's lines decided in-line, which write a promotion
-- only through `credit` or not at all; the batch empties `kept` when another line
-- runs.
local function kept_promotion(kept, key)
  local promo = kept[key]
  if promo == nil then
    local ok
    ok, promo = pcall(read_promotion, key)
    if not ok then return false end
    kept[key] = promo or false
  end
  return true, promo or nil
end

-- promo:{P}:used:{C}: nil when absent.
local function read_used(key)
  local v = read_string(key)
  if v == nil then return nil end
  if not canonical(v) then corrupt(key, 'value', v) end
  return tonumber(v)
end

-- promo:{P}:order:{O}, the lean layout (docs/contract.md section 2; issue 27
-- item 2): one string, its fields joined by '|', positional first (empty =
-- absent), then one `<name>=<value>` for each `absorbed:<E>` and `refund:<E>`:
--   state|event|budget|stock|budget0|stock0|customer|counted|gen|absorbed[|name=value...]
-- state is `d` (deducted) or `r` (reverted); an empty budget0 / stock0 is equal to
-- budget / stock (the common case: nothing refunded yet); trailing empty fields are
-- left off. '|' and '=' are in no event id, number or result, so the split is exact.
-- Records written by releases before it are hashes with the same fields by name
-- (the previous layout); read_record reads both, and every write stores the lean
-- one (SET over the hash, KEEPTTL), so a rolling upgrade converts records as they
-- are touched.
local RECORD_FIELDS = { 'state', 'event', 'budget', 'stock', 'budget0', 'stock0', 'customer',
  'counted', 'gen', 'absorbed' }
local STATE_NAME = { d = 'deducted', r = 'reverted' }
local STATE_CODE = { deducted = 'd', reverted = 'r' }

-- A lean record's value as the field table a hash of the previous layout gives
-- (HGETALL), or nil when it is not one (corrupt).
local function decode_record(v)
  local h, i = {}, 0
  for tok in string.gmatch(v .. '|', '([^|]*)|') do
    i = i + 1
    if i <= #RECORD_FIELDS then
      if tok ~= '' then h[RECORD_FIELDS[i]] = tok end
    else
      local name, value = string.match(tok, '^([^=]+)=(.*)$')
      if not name or not (string.sub(name, 1, 9) == 'absorbed:' or string.sub(name, 1, 7) == 'refund:')
        or h[name] ~= nil then
        return nil
      end
      h[name] = value
    end
  end
  h.state = STATE_NAME[h.state or '']
  if h.state == nil then return nil end
  h.budget0 = h.budget0 or h.budget
  h.stock0 = h.stock0 or h.stock
  return h
end

-- The lean value of a record's field table (only fields read_record validated or
-- a script wrote; any other field of a previous-layout hash is dropped).
local function encode_record(h)
  local t = {}
  for i, f in ipairs(RECORD_FIELDS) do t[i] = h[f] or '' end
  t[1] = STATE_CODE[h.state]
  if h.budget0 == h.budget then t[5] = '' end
  if h.stock0 == h.stock then t[6] = '' end
  local extra = {}
  for f, v in pairs(h) do
    if string.sub(f, 1, 9) == 'absorbed:' or string.sub(f, 1, 7) == 'refund:' then
      extra[#extra + 1] = f .. '=' .. v
    end
  end
  local n = #RECORD_FIELDS
  if #extra == 0 then
    while n > 1 and t[n] == '' do n = n - 1 end
  end
  table.sort(extra)
  return table.concat(t, '|', 1, n) .. (#extra > 0 and '|' .. table.concat(extra, '|') or '')
end

-- The lean value of a tombstone with nothing outstanding ({state = reverted, budget =
-- stock = budget0 = stock0 = 0}, encode_record's result for those fields), to which
-- its refund results are appended as '|refund:<E>=<result>'.
local TOMBSTONE = 'r||0|0||||||'

-- The lean value of a new deduction (encode_record's result for those fields,
-- built in one concatenation: the placement's hot path).
local function new_record_value(event, budget, stock, customer, counted, gen)
  local v = 'd|' .. event .. '|' .. budget .. '|' .. stock .. '|||' .. customer .. '|' .. counted
  if gen then v = v .. '|' .. gen end
  return v
end

-- Stores a record's field table: with its TTL in one command (`ttl`, seconds), or
-- keeping the key's TTL (ttl nil; over a previous-layout hash too).
local function write_record(key, h, ttl)
  if ttl then
    redis.call('SET', key, encode_record(h), 'EX', ttl)
  else
    redis.call('SET', key, encode_record(h), 'KEEPTTL')
  end
end

-- Adds a new record's order id to its day index promo:{P}:index:<D> (KEYS[5] of
-- deduct.lua and rollback.lua on a standalone server; nil: none kept), so that the
-- set outlives every record it names: when the set's time to live is below the new
-- record's (`record_ttl`, seconds), or it has none, it is raised to `ttl` (the
-- record's TTL plus a day), and only ever raised (GT leaves a set without a TTL
-- alone: a new one gets it with NX). A set that already outlives the record is
-- left as it is: one read (PTTL) instead of a write on most calls, as a day's
-- index is raised a day ahead of its records when it is made. (A Redis user
-- whose ACL predates this rule may be refused PTTL: the TTL is then raised as
-- it was before, on every call.) Called before the
-- record's other writes: a refusal (OOM, NOPERM) ends the line before anything is
-- written, and an index of another type is corrupt data, remembered by `guarded`
-- like any other.
local function raise_index_ttl(key, ttl, record_ttl)
  local left = redis.pcall('PTTL', key)
  if type(left) == 'number' and left >= 0 and left >= tonumber(record_ttl) * 1000 then return end
  if redis.call('EXPIRE', key, ttl, 'GT') == 0 then redis.call('EXPIRE', key, ttl, 'NX') end
end
local function index_record(key, order, ttl, record_ttl, guarded)
  if not key then return end
  guarded(function() wrong_type(key, redis.pcall('SADD', key, order)) end)
  raise_index_ttl(key, ttl, record_ttl)
end

-- promo:{P}:order:{O}: nil when absent. Besides the amounts, a record may hold
-- (all optional: records written before they existed lack them):
--   customer  the customer the deduction was made for (refunds act on it)
--   counted   "1" when the deduction took a per-customer slot (used += 1), "0" when not
--   gen       the promotion's incarnation when deducted (absent: it had none)
--   absorbed  the first other event of the order that deduct step 1 absorbed into it
--   absorbed:E  for each further event E absorbed while `absorbed` named another: the
--             order it came in (1, 2, ...); the first of them takes the place of
--             `absorbed` when that one is released or handed the record
--   refund:E  the result of refund event E on this line: "applied <b> <s>" | "rejected <reason>"
-- r.fields keeps the record's field table (for the refund results, and for
-- write_record after a change).
local function read_record(key)
  local h
  local v = redis.pcall('GET', key)
  if type(v) == 'table' and v.err then
    if string.sub(v.err, 1, 9) ~= 'WRONGTYPE' then fail(v.err) end
    h = read_hash(key) -- the previous layout (or another type: corrupt)
    if not h then return nil end
  elseif v == false then
    return nil
  else
    h = decode_record(v)
    if not h then corrupt(key, 'value', v) end
  end
  local r = { state = h.state, event = h.event, customer = h.customer, gen = h.gen, absorbed = h.absorbed, fields = h }
  if r.state ~= 'deducted' and r.state ~= 'reverted' then corrupt(key, 'state', h.state or '(absent)') end
  for _, f in ipairs({ 'budget', 'stock', 'budget0', 'stock0' }) do
    local v = h[f]
    if not canonical(v) then corrupt(key, f, v or '(absent)') end
    r[f] = tonumber(v)
  end
  if r.budget > r.budget0 then corrupt(key, 'budget', h.budget) end
  if r.stock > r.stock0 then corrupt(key, 'stock', h.stock) end
  if r.state == 'deducted' and (r.event == nil or r.event == '') then corrupt(key, 'event', r.event or '(absent)') end
  if r.customer ~= nil and not event_id(r.customer) then corrupt(key, 'customer', r.customer) end
  if r.absorbed ~= nil and not event_id(r.absorbed) then corrupt(key, 'absorbed', r.absorbed) end
  if h.counted ~= nil and h.counted ~= '0' and h.counted ~= '1' then corrupt(key, 'counted', h.counted) end
  for f in pairs(h) do
    if string.sub(f, 1, 9) == 'absorbed:' and not (event_id(string.sub(f, 10)) and canonical(h[f])) then
      corrupt(key, f, h[f])
    end
  end
  if r.gen ~= nil and not canonical(r.gen) then corrupt(key, 'gen', r.gen) end
  -- nil: a record written before the field existed (its slot is given back as before).
  if h.counted ~= nil then r.counted = h.counted == '1' end
  return r
end

-- The further absorbed events of a record (its `absorbed:E` fields), in the order
-- they came (the fields' numbers; read_record validated them).
local function further_absorbed(rec)
  local list = {}
  for f, v in pairs(rec.fields) do
    if string.sub(f, 1, 9) == 'absorbed:' then list[#list + 1] = { e = string.sub(f, 10), n = tonumber(v) } end
  end
  table.sort(list, function(a, b) return a.n < b.n end)
  local out = {}
  for i, x in ipairs(list) do out[i] = x.e end
  return out
end

-- Whether the record was deducted from the promotion's current incarnation: a
-- promotion replaced or deleted and re-created (another `gen`) never gets back
-- what was taken from the old one (docs/contract.md section 3).
local function same_incarnation(promo, rec)
  return promo ~= nil and promo.gen == rec.gen
end

-- Adds `amount` back to `field` of the promotion, never past its initial amount
-- (`initial_<field>`, when stored) nor past MAX_DIGITS: no script writes a value
-- the scripts would then refuse as corrupt. Returns the new remaining amount.
local function credit(k_promo, promo, field, amount)
  local left = promo[field]
  if left == nil or amount == 0 then return left end
  local cap = promo['initial_' .. field] or MAX_AMOUNT
  if cap > MAX_AMOUNT then cap = MAX_AMOUNT end
  local room = cap - left
  if room <= 0 then return left end
  if amount > room then amount = room end
  promo[field] = redis.call('HINCRBY', k_promo, field, int(amount))
  return promo[field]
end

-- The rejection reasons a placement's memo promo:{P}:rejected:{E} may hold.
local REASONS = {
  budget_exceeded = true, stock_insufficient = true, user_limit_reached = true,
  promotion_not_found = true, promotion_inactive = true, order_reverted = true,
  corrupt_promotion = true,
}
-- The rejection deduct.lua remembers when it meets corrupt data.
local CORRUPT_REASON = 'corrupt_promotion'
-- The memo's value when deduct.lua step 1 absorbed the event into another event's record.
local ABSORBED = 'accepted'
-- The memo's value when release.lua released the line for a rejected event.
local RELEASED = 'released'

-- Whether a caught error is a fail() of corrupt data.
local function is_corrupt(err)
  return type(err) == 'table' and type(err.fail) == 'string' and string.sub(err.fail, 1, 8) == 'CORRUPT '
end

-- read(key), or nil when the key holds corrupt data (any other error is raised).
local function lenient(read, key)
  local ok, res = pcall(read, key)
  if ok then return res end
  if is_corrupt(res) then return nil end
  error(res, 0)
end

-- Runs read(); when it fails on corrupt data, `value` is first stored under the
-- event's memo `key` (TTL `ttl`), so that every delivery of the event repeats the
-- rejection (the memo is the only write; docs/contract.md section 2).
local function remembering_corrupt(key, value, ttl, read)
  local ok, err = pcall(read)
  if ok then return end
  if is_corrupt(err) then redis.call('SET', key, value, 'EX', ttl) end
  error(err, 0)
end

-- Runs a script's main(): its reply, or the error reply of a fail(), or the
-- error of a Redis command it called (OOM, READONLY, BUSY, ...) replied as it is,
-- so that the reply still starts with the command error's code. (Redis 7.0 hands
-- pcall that error as its bare message, later versions as a table {err = ...};
-- re-raised as a Lua error, either came back as "ERR <message> script: <sha>, on
-- @user_script:<n>." and its code was lost: an OOM read as a fatal ERR.) Any
-- other Lua error (a runtime error: "user_script:<n>: ...") is re-raised.
local function run(main)
  local ok, res = pcall(main)
  if ok then return res end
  if type(res) == 'table' and res.fail then return redis.error_reply(res.fail) end
  if type(res) == 'table' and type(res.err) == 'string' then return redis.error_reply(res.err) end
  if type(res) == 'string' and string.find(res, '^[A-Z][A-Z]+ ') then return redis.error_reply(res) end
  error(res, 0)
end

-- One element of a batch script's reply (deduct_batch.lua, rollback_batch.lua,
-- memo_batch.lua), from `pcall` of a script's body for one line: its reply, or
-- {"ERR", message} where the script alone would have replied with an error.
local function batch_element(ok, r)
  if not ok then r = { err = type(r) == 'table' and (r.err or r.fail) or tostring(r) } end
  if type(r) == 'table' and r.err then return { 'ERR', r.err } end
  return r
end
