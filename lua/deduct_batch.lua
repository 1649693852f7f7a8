-- deduct_batch.lua: N lines of deduct.lua in one call (issue 14), decided one after
-- another in the order given, exactly as N calls of deduct.lua in a row would be:
-- the body of deduct.lua runs unchanged as `deduct_one(KEYS, ARGV, read_promotion,
-- redis)` for each line.
--
-- KEYS[4i+1 .. 4i+4]  line i's KEYS[1..4] of deduct.lua (promotion, used, record, memo)
-- ARGV[1]             count  N, a positive canonical integer, #KEYS == 4 N
-- ARGV[7i+2 .. 7i+8]  line i's ARGV[1..7] of deduct.lua
--   or, every line with deduct.lua's index (a standalone server): #KEYS == 5 N,
--   KEYS[5i+1 .. 5i+5] line i's KEYS[1..5], ARGV[9i+2 .. 9i+10] line i's ARGV[1..9]
--
-- Reply: N elements, line i's deduct.lua reply, or {"ERR", message} where deduct.lua
--   would have replied with an error (BADARG, CORRUPT, or a Redis error of a command):
--   one line's error never stops the lines after it, as separate calls would not.
--
-- Coalescing by promotion (issue 27 item 1). Within one call nothing but this
-- batch's own lines touches a promotion hash, and deduct.lua writes nothing to it
-- but HINCRBY of `budget` and `stock`. So each promotion key the batch touches is
-- read and validated once (read_promotion of lib.lua: the parsed promotion, its
-- absence, or the CORRUPT error it raised, kept per key for the call), every line
-- decides against an in-script running balance, and each promotion's counters are
-- written once at the end, after the last line (one HSET of the fields that
-- moved: the counters as read plus the sum of the lines' moves). A line's moves
-- count only when the line replies without an error (a Redis error of a later
-- write of that line undoes them, as if its HINCRBY had never run: on a separate
-- call it would have been the first write, refused alike). Each reply's
-- remaining_budget/remaining_stock is the running value after that line, as if
-- written. When a line's used, record or memo key is also a promotion key of the
-- batch (never the case for keys the service builds), the batch runs
-- uncoalesced, line by line against Redis, through deduct.lua's body.
--
-- The fresh line (issue 27: Redis time per line). Most lines of a sale are a new
-- event of a new order: no memo, no record. Such a line is decided here, by
-- `fresh`, without deduct.lua's per-call set-up (its argument table, its closures,
-- its pcall layers): the same checks in the same order (deduct.lua steps 3 to 6),
-- the same writes, and the same reply, with three reads (memo, record, used) and
-- the writes of its decision. Every other line (a memo or a record exists, a key
-- holds another type, corrupt data, a malformed argument, a refused index write)
-- is handed, before anything of it is written, to deduct.lua's body, run
-- unchanged as `deduct_one(KEYS, ARGV, read_promotion, redis)` with two
-- stand-ins for the coalescing:
--   read_promotion(key)  the cached promotion, whose budget and stock are the running
--                        balance (or the cached CORRUPT error raised again);
--   redis                the real `redis`, except that HINCRBY on a promotion key
--                        of the batch moves the running balance instead of Redis.
-- Every other read and write (memo, record, used) goes to Redis as before, line
-- by line, so each line still sees what the lines before it wrote.
--
-- The day index (KEYS[5i+5], a standalone server). The first fresh line of the
-- batch that adds to an index key adds its order id at once, as its first write,
-- and raises the set's TTL (lib.lua's rule); the later fresh lines of the same
-- key only note their order ids, added by one SADD after the last line (the set
-- is known to be a set by then, and the rule, judged again within one call with
-- the same TTLs, would leave the TTL as it is; a line with other TTLs is judged
-- again). A line handed to deduct.lua's body indexes its record itself.
--
-- Loaded as lua/lib.lua, then `local function deduct_one(KEYS, ARGV, read_promotion,
-- redis)` around lua/deduct.lua, then this file (src/ledger/scripts.rs).

local n = tonumber(ARGV[1])
-- Keys and arguments per line: 4 and 7, or 5 and 9 with the index.
local nk = (n and n >= 1 and #KEYS == 5 * n) and 5 or 4
local na = 2 * nk - 1
if n == nil or n < 1 or n ~= math.floor(n) or #KEYS ~= nk * n or #ARGV ~= 1 + na * n then
  return redis.error_reply('BADARG batch of ' .. tostring(ARGV[1]) .. ' lines with '
    .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end

-- The promotion keys of the batch; coalesced only when no other key of a line is
-- one of them.
local is_promotion = {}
for i = 0, n - 1 do is_promotion[KEYS[nk * i + 1]] = true end
local coalesce = true
for i = 0, n - 1 do
  for j = 2, nk do
    if is_promotion[KEYS[nk * i + j]] then coalesce = false end
  end
end

-- key -> { promo = the promotion read (nil: absent), its budget and stock the running
--          balance; err = its CORRUPT error; budget0, stock0 = the counters as read;
--          moved = { budget = n, stock = n }, the sum of the moves of the lines that stood }
local cache = {}
local touched = {} -- the keys of `cache` in the order first read (the writes' order)
-- The current line's moves, to undo when it ends in an error: key, field, old value, ...
local line_moves, nmoves = {}, 0

local function entry(key)
  local ok, res = pcall(read_promotion, key)
  local c
  if ok then
    c = { promo = res, moved = { budget = 0, stock = 0 } }
    if res then c.budget0, c.stock0 = res.budget, res.stock end
  elseif is_corrupt(res) or (type(res) == 'table' and type(res.fail) == 'string'
      and string.sub(res.fail, 1, 9) == 'BUCKETED ') then
    -- (A bucketed promotion's directory: every line of it gets the error.)
    c = { err = res }
  else
    error(res, 0) -- not a property of the data (NOPERM, ...): not kept, read again
  end
  cache[key] = c
  touched[#touched + 1] = key
  return c
end

-- deduct.lua gets the cached table itself (no copy a line): it only reads it, and
-- sets `budget`/`stock` to what HINCRBY returns, the running balance they hold already.
local function cached_promotion(key)
  local c = cache[key] or entry(key)
  if c.err then error(c.err, 0) end
  return c.promo
end

-- Moves the running balance of a cached promotion by `by` (a line's deduction);
-- remembered as the line's move. Returns the new balance, as HINCRBY would.
local function move(key, field, by)
  local p = cache[key].promo
  line_moves[nmoves + 1], line_moves[nmoves + 2], line_moves[nmoves + 3] = key, field, p[field]
  line_moves[nmoves + 4] = tonumber(by)
  nmoves = nmoves + 4
  p[field] = p[field] + tonumber(by)
  return p[field]
end

local batch_redis = setmetatable({
  call = function(cmd, key, ...)
    if cmd == 'HINCRBY' then
      local c = cache[key]
      if c and c.promo then
        local field, by = ...
        return move(key, field, by)
      end
    end
    return redis.call(cmd, key, ...)
  end,
}, { __index = redis })

-- index key -> the order ids of the later fresh lines, added after the last line;
-- and -> the index and record TTLs (ARGV texts) its TTL was last judged against
local index_pending, index_keys, index_ttls = {}, {}, {}

-- Argument texts already found canonical in this call: a batch repeats its TTLs,
-- amounts and times on every line. `ok_time` the same for business times, which
-- may be negative (`signed`); kept apart, as a negative text is no amount.
local ok_num, ok_time = {}, {}
local function num(v)
  if ok_num[v] then return true end
  if canonical(v) then
    ok_num[v] = true
    return true
  end
  return false
end
local function time_ok(t)
  if ok_time[t] then return true end
  if signed(t) then
    ok_time[t] = true
    return true
  end
  return false
end

-- Whether line i's arguments (ARGV[ab+1 .. ab+na]) pass deduct.lua's checks; the
-- line that does not is handed to deduct.lua, which names the first bad one.
local function valid_args(ab)
  local t = ARGV[ab + 3]
  if not (num(ARGV[ab + 1]) and num(ARGV[ab + 2]) and (ok_num[t] or time_ok(t))
      and ARGV[ab + 5] ~= '0' and num(ARGV[ab + 5]) and ARGV[ab + 6] ~= '0' and num(ARGV[ab + 6])) then
    return false
  end
  -- The ids (event, customer, order: new on most lines), each matched on its
  -- own, inline: what lib.lua's event_id checks (an ARGV element is a string,
  -- and the pattern needs one character), without a call a line, and without
  -- joining the three into a new string to match once (both cost more).
  local e, c = ARGV[ab + 4], ARGV[ab + 7]
  if #e > 64 or #c > 64 or not find(e, EVENT_ID) or not find(c, EVENT_ID) then return false end
  if na == 7 then return true end
  local o = ARGV[ab + 8]
  return #o <= 64 and find(o, EVENT_ID) ~= nil and ARGV[ab + 9] ~= '0' and num(ARGV[ab + 9])
end

-- A fresh line (keys KEYS[kb+1 ..], arguments ARGV[ab+1 ..]) decided as deduct.lua
-- steps 3 to 6 decide it: its reply, or nil when it is not a fresh line (nothing
-- of it written; deduct.lua's body decides it).
local function fresh(kb, ab)
  if not valid_args(ab) then return nil end
  local k_promo, k_used, k_record, k_memo = KEYS[kb + 1], KEYS[kb + 2], KEYS[kb + 3], KEYS[kb + 4]
  local event = ARGV[ab + 4]
  if redis.pcall('GET', k_memo) ~= false then return nil end
  if redis.pcall('GET', k_record) ~= false then return nil end
  local c = cache[k_promo] or entry(k_promo)
  if c.err then return nil end
  local used = redis.pcall('GET', k_used)
  if used == false then
    used = 0
  elseif canonical(used) then
    used = tonumber(used)
  else
    return nil -- another type, or not a canonical count: corrupt
  end
  local promo = c.promo
  local b, s, t = tonumber(ARGV[ab + 1]), tonumber(ARGV[ab + 2]), tonumber(ARGV[ab + 3])
  local reason
  if not promo then
    reason = 'promotion_not_found'
  elseif promo.status == 'paused' or (promo.starts_at and t < promo.starts_at)
    or (promo.ends_at and t >= promo.ends_at) then
    reason = 'promotion_inactive'
  elseif promo.budget and promo.budget < b then
    reason = 'budget_exceeded'
  elseif promo.stock and promo.stock < s then
    reason = 'stock_insufficient'
  elseif promo.per_customer and used >= promo.per_customer then
    reason = 'user_limit_reached'
  end
  if reason then
    redis.call('SET', k_memo, reason, 'EX', ARGV[ab + 6])
    if not promo then return { 'rejected', reason, 0, 0, 0, -1, -1 } end
    return { 'rejected', reason, 0, 0, 0, promo.budget or -1, promo.stock or -1 }
  end
  if nk == 5 then
    local k_index = KEYS[kb + 5]
    local pending = index_pending[k_index]
    local ttl, rttl = ARGV[ab + 9], ARGV[ab + 5]
    if pending then
      pending[#pending + 1] = ARGV[ab + 8]
      -- (Other TTLs than the line that raised it: lib.lua's rule for these too.)
      local judged = index_ttls[k_index]
      if judged[1] ~= ttl or judged[2] ~= rttl then
        raise_index_ttl(k_index, ttl, rttl)
        index_ttls[k_index] = { ttl, rttl }
      end
    else
      -- Another type (corrupt) or a refusal (OOM, NOPERM): nothing written yet,
      -- deduct.lua's body meets it again and answers as it does.
      local r = redis.pcall('SADD', k_index, ARGV[ab + 8])
      if type(r) == 'table' then return nil end
      raise_index_ttl(k_index, ttl, rttl)
      index_pending[k_index] = {}
      index_ttls[k_index] = { ttl, rttl }
      index_keys[#index_keys + 1] = k_index
    end
  end
  local record_ttl, counted = ARGV[ab + 5], '0'
  if promo.per_customer then
    redis.call('SET', k_used, int(used + 1), 'EX', record_ttl)
    counted = '1'
  end
  redis.call('SET', k_record, new_record_value(event, ARGV[ab + 1], ARGV[ab + 2], ARGV[ab + 7], counted,
    promo.gen), 'EX', record_ttl)
  if promo.budget then move(k_promo, 'budget', -b) end
  if promo.stock then move(k_promo, 'stock', -s) end
  return { 'accepted', '', 0, b, s, promo.budget or -1, promo.stock or -1 }
end

local out = {}
for i = 0, n - 1 do
  nmoves = 0
  local ok, r = true, nil
  -- A Redis error raised in `fresh` (a refused write) is the line's error, as
  -- deduct.lua's would be; nil hands the line to deduct.lua's body.
  if coalesce then ok, r = pcall(fresh, nk * i, 1 + na * i) end
  if ok and r == nil then
    local keys = {}
    for j = 1, nk do keys[j] = KEYS[nk * i + j] end
    local args = {}
    for j = 1, na do args[j] = ARGV[1 + na * i + j] end
    if coalesce then
      ok, r = pcall(deduct_one, keys, args, cached_promotion, batch_redis)
    else
      ok, r = pcall(deduct_one, keys, args, read_promotion, redis)
    end
  end
  out[i + 1] = batch_element(ok, r)
  local failed = out[i + 1][1] == 'ERR' -- (deduct.lua's replies start with a status)
  -- A line that ended in an error moved nothing (its HINCRBY would not have run
  -- or was its last command); the moves of a line that stood are summed.
  for m = nmoves - 3, 1, -4 do
    local c = cache[line_moves[m]]
    if failed then
      c.promo[line_moves[m + 1]] = line_moves[m + 2]
    else
      c.moved[line_moves[m + 1]] = c.moved[line_moves[m + 1]] + line_moves[m + 3]
    end
  end
end

-- The order ids of the later fresh lines of each day index, in one SADD a key.
for _, key in ipairs(index_keys) do
  local pending = index_pending[key]
  if #pending > 0 then redis.call('SADD', key, unpack(pending)) end
end

-- The counters each promotion ends with, written once.
for _, key in ipairs(touched) do
  local c = cache[key]
  if c.promo then
    local fields = {}
    for _, f in ipairs({ 'budget', 'stock' }) do
      if c.moved[f] ~= 0 then
        fields[#fields + 1] = f
        fields[#fields + 1] = int(c[f .. '0'] + c.moved[f])
      end
    end
    if #fields > 0 then redis.call('HSET', key, unpack(fields)) end
  end
end
return out
