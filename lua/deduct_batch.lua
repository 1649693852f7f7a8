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
-- moved: the counters as read plus the sum of the lines' moves). deduct_one gets two
-- stand-ins for that:
--   read_promotion(key)  the cached promotion, whose budget and stock are the running
--                        balance (or the cached CORRUPT error raised again);
--   redis                the real `redis`, except that HINCRBY on a promotion key
--                        of the batch moves the running balance instead of Redis.
-- A line's moves count only when the line replies without an error (a Redis error
-- of a later write of that line undoes them, as if its HINCRBY had never run: on a
-- separate call it would have been the first write, refused alike). Every other
-- read and write (memo, record, used) goes to
-- Redis as before, line by line, so each line still sees what the lines before it
-- wrote. Each reply's remaining_budget/remaining_stock is the running value after
-- that line, as if written. When a line's used, record or memo key is also a
-- promotion key of the batch (never the case for keys the service builds), the
-- batch runs uncoalesced, line by line against Redis. A promotion with one line in
-- the batch has nothing to share: that line runs as deduct.lua does (its own read,
-- its own HINCRBY), which keeps a batch spread over many promotions as cheap as
-- before.
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

-- The promotion keys of the batch and how many lines each has; coalesced only when
-- no other key of a line is one of them.
local lines_of = {}
for i = 0, n - 1 do
  local key = KEYS[nk * i + 1]
  lines_of[key] = (lines_of[key] or 0) + 1
end
local coalesce = true
for i = 0, n - 1 do
  for j = 2, nk do
    if lines_of[KEYS[nk * i + j]] then coalesce = false end
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
  elseif is_corrupt(res) then
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

local batch_redis = setmetatable({
  call = function(cmd, key, ...)
    if cmd == 'HINCRBY' then
      local c = cache[key]
      if c and c.promo then
        local field, by = ...
        local p = c.promo
        line_moves[nmoves + 1], line_moves[nmoves + 2], line_moves[nmoves + 3] = key, field, p[field]
        line_moves[nmoves + 4] = tonumber(by)
        nmoves = nmoves + 4
        p[field] = p[field] + tonumber(by)
        return p[field]
      end
    end
    return redis.call(cmd, key, ...)
  end,
}, { __index = redis })

local out = {}
for i = 0, n - 1 do
  local keys = {}
  for j = 1, nk do keys[j] = KEYS[nk * i + j] end
  local args = {}
  for j = 1, na do args[j] = ARGV[1 + na * i + j] end
  nmoves = 0
  local ok, r
  if coalesce and lines_of[keys[1]] > 1 then
    ok, r = pcall(deduct_one, keys, args, cached_promotion, batch_redis)
  else
    ok, r = pcall(deduct_one, keys, args, read_promotion, redis)
  end
  if not ok then
    r = { err = type(r) == 'table' and (r.err or r.fail) or tostring(r) }
  end
  local failed = type(r) == 'table' and r.err
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
  if failed then
    out[i + 1] = { 'ERR', r.err }
  else
    out[i + 1] = r
  end
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
