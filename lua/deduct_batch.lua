-- deduct_batch.lua: N lines of deduct.lua in one call (issue 14), decided one after
-- another in the order given, exactly as N calls of deduct.lua in a row would be:
-- the body of deduct.lua runs unchanged as `deduct_one(KEYS, ARGV)` for each line.
--
-- KEYS[4i+1 .. 4i+4]  line i's KEYS[1..4] of deduct.lua (promotion, used, record, memo)
-- ARGV[1]             count  N, a positive canonical integer, #KEYS == 4 N
-- ARGV[7i+2 .. 7i+8]  line i's ARGV[1..7] of deduct.lua
--
-- Reply: N elements, line i's deduct.lua reply, or {"ERR", message} where deduct.lua
--   would have replied with an error (BADARG, CORRUPT, or a Redis error of a command):
--   one line's error never stops the lines after it, as separate calls would not.
--
-- Loaded as lua/lib.lua, then `local function deduct_one(KEYS, ARGV)` around
-- lua/deduct.lua, then this file (src/ledger/scripts.rs).

local n = tonumber(ARGV[1])
if n == nil or n < 1 or n ~= math.floor(n) or #KEYS ~= 4 * n or #ARGV ~= 1 + 7 * n then
  return redis.error_reply('BADARG batch of ' .. tostring(ARGV[1]) .. ' lines with '
    .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end
local out = {}
for i = 0, n - 1 do
  local keys = { KEYS[4 * i + 1], KEYS[4 * i + 2], KEYS[4 * i + 3], KEYS[4 * i + 4] }
  local args = {}
  for j = 1, 7 do args[j] = ARGV[1 + 7 * i + j] end
  local ok, r = pcall(deduct_one, keys, args)
  if not ok then
    r = { err = type(r) == 'table' and (r.err or r.fail) or tostring(r) }
  end
  if type(r) == 'table' and r.err then
    out[i + 1] = { 'ERR', r.err }
  else
    out[i + 1] = r
  end
end
return out
