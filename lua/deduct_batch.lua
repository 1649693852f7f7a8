-- deduct_batch.lua: N lines of deduct.lua in one call (issue 14), decided one after
-- another in the order given, exactly as N calls of deduct.lua in a row would be:
-- the body of deduct.lua runs unchanged as `deduct_one(KEYS, ARGV, read_promotion,
-- redis)` for each line.
--
-- KEYS[4i+1 .. 4i+4]  line i's KEYS[1..4] of deduct.lua (promotion, used, record, memo)
-- ARGV[1]             count  N, a positive canonical integer, #KEYS == 4 N
-- ARGV[7i+2 .. 7i+8]  line i's ARGV[1..7] of deduct.lua
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
-- changed, to their final values). deduct_one gets two stand-ins for that:
--   read_promotion(key)  a copy of the cached promotion with the running balance
--                        (or the cached CORRUPT error raised again);
--   redis                the real `redis`, except that HINCRBY on a promotion key
--                        of the batch moves the running balance instead of Redis.
-- A line's balance moves are kept aside until the line has replied without an
-- error (a Redis error of a later write of that line drops them, as its HINCRBY
-- would never have run). Every other read and write (memo, record, used) goes to
-- Redis as before, line by line, so each line still sees what the lines before it
-- wrote. Each reply's remaining_budget/remaining_stock is the running value after
-- that line, as if written. When a line's used, record or memo key is also a
-- promotion key of the batch (never the case for keys the service builds), the
-- batch runs uncoalesced, line by line against Redis.
--
-- Loaded as lua/lib.lua, then `local function deduct_one(KEYS, ARGV, read_promotion,
-- redis)` around lua/deduct.lua, then this file (src/ledger/scripts.rs).

local n = tonumber(ARGV[1])
if n == nil or n < 1 or n ~= math.floor(n) or #KEYS ~= 4 * n or #ARGV ~= 1 + 7 * n then
  return redis.error_reply('BADARG batch of ' .. tostring(ARGV[1]) .. ' lines with '
    .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end

-- The promotion keys of the batch; coalesced only when no other key of a line is one.
local promos = {}
for i = 0, n - 1 do promos[KEYS[4 * i + 1]] = true end
local coalesce = true
for i = 0, n - 1 do
  for j = 2, 4 do
    if promos[KEYS[4 * i + j]] then coalesce = false end
  end
end

-- key -> { promo = the promotion read (nil: absent), err = its CORRUPT error,
--          budget0/stock0 = the stored counters as read }
local cache = {}
local touched = {} -- the keys of `cache` in the order first read (the writes' order)
-- The balance moves of the line being decided: key -> { budget = n, stock = n }.
local moves = {}

local function entry(key)
  local c = cache[key]
  if c then return c end
  local ok, res = pcall(read_promotion, key)
  if ok then
    c = { promo = res }
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

-- The running balance of `key`'s promotion: the cache moved by the current line.
local function running(c, key, field)
  local m = moves[key]
  return c.promo[field] + (m and m[field] or 0)
end

local function cached_promotion(key)
  local c = entry(key)
  if c.err then error(c.err, 0) end
  if not c.promo then return nil end
  local p = {}
  for f, v in pairs(c.promo) do p[f] = v end
  if p.budget then p.budget = running(c, key, 'budget') end
  if p.stock then p.stock = running(c, key, 'stock') end
  return p
end

local batch_redis = setmetatable({
  call = function(cmd, key, ...)
    if cmd == 'HINCRBY' and cache[key] and cache[key].promo then
      local field, by = ...
      local m = moves[key] or {}
      moves[key] = m
      m[field] = (m[field] or 0) + tonumber(by)
      return running(cache[key], key, field)
    end
    return redis.call(cmd, key, ...)
  end,
}, { __index = redis })

local out = {}
for i = 0, n - 1 do
  local keys = { KEYS[4 * i + 1], KEYS[4 * i + 2], KEYS[4 * i + 3], KEYS[4 * i + 4] }
  local args = {}
  for j = 1, 7 do args[j] = ARGV[1 + 7 * i + j] end
  moves = {}
  local ok, r
  if coalesce then
    ok, r = pcall(deduct_one, keys, args, cached_promotion, batch_redis)
  else
    ok, r = pcall(deduct_one, keys, args, read_promotion, redis)
  end
  if not ok then
    r = { err = type(r) == 'table' and (r.err or r.fail) or tostring(r) }
  end
  if type(r) == 'table' and r.err then
    out[i + 1] = { 'ERR', r.err }
  else
    -- The line stands: its moves join the running balance.
    for key, m in pairs(moves) do
      local p = cache[key].promo
      for field, by in pairs(m) do p[field] = p[field] + by end
    end
    out[i + 1] = r
  end
end

-- The counters each promotion ends with, written once.
for _, key in ipairs(touched) do
  local c = cache[key]
  local p = c.promo
  if p then
    local fields = {}
    if p.budget ~= c.budget0 then
      fields[#fields + 1] = 'budget'
      fields[#fields + 1] = int(p.budget)
    end
    if p.stock ~= c.stock0 then
      fields[#fields + 1] = 'stock'
      fields[#fields + 1] = int(p.stock)
    end
    if #fields > 0 then redis.call('HSET', key, unpack(fields)) end
  end
end
return out
