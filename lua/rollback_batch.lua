-- rollback_batch.lua: N lines of rollback.lua in one call (issue 27: script calls
-- per event), decided one after another in the order given, exactly as N calls of
-- rollback.lua in a row would be: rollback.lua's body runs unchanged as
-- `rollback_one(KEYS, ARGV)` for each line, every read and write going to Redis
-- line by line, so each line sees what the lines before it wrote. The service
-- sends the refund lines that are ready, of many events, as one call, on a single
-- Redis or a Sentinel primary with redis.wait_replicas = 0 (as deduct_batch.lua).
--
-- KEYS[5i+1 .. 5i+5]  line i's KEYS[1..5] of rollback.lua (promotion, used, record,
--                     memo, index)
-- ARGV[1]             count  N, a positive canonical integer, #KEYS == 5 N
-- ARGV[8i+2 .. 8i+9]  line i's ARGV[1..8] of rollback.lua
--   or, every line without rollback.lua's index: #KEYS == 4 N, KEYS[4i+1 .. 4i+4]
--   line i's KEYS[1..4], ARGV[6i+2 .. 6i+7] line i's ARGV[1..6]
--
-- Reply: N elements, line i's rollback.lua reply, or {"ERR", message} where
--   rollback.lua would have replied with an error (BADARG, CORRUPT, or a Redis error
--   of a command): one line's error never stops the lines after it, as separate
--   calls would not.
--
-- Error replies: "BADARG <what>" (the count does not match the keys and arguments):
--   nothing written.
--
-- Loaded as lua/lib.lua, then `local function rollback_one(KEYS, ARGV)` around
-- lua/rollback.lua, then this file (src/ledger/scripts.rs).

local n = tonumber(ARGV[1])
-- Keys and arguments per line: 5 and 8 with the index, or 4 and 6.
local nk = (n and n >= 1 and #KEYS == 5 * n) and 5 or 4
local na = nk == 5 and 8 or 6
if n == nil or n < 1 or n ~= math.floor(n) or #KEYS ~= nk * n or #ARGV ~= 1 + na * n then
  return redis.error_reply('BADARG batch of ' .. tostring(ARGV[1]) .. ' lines with '
    .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end

local out = {}
for i = 0, n - 1 do
  local keys, args = {}, {}
  for j = 1, nk do keys[j] = KEYS[nk * i + j] end
  for j = 1, na do args[j] = ARGV[1 + na * i + j] end
  out[i + 1] = batch_element(pcall(rollback_one, keys, args))
end
return out
