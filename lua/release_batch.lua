-- release_batch.lua: N lines of release.lua in one call (issue 27: script calls
-- per event), decided one after another in the order given, exactly as N calls of
-- release.lua in a row would be: release.lua's body runs unchanged as
-- `release_one(KEYS, ARGV)` for each line, every read and write going to Redis
-- line by line, so each line sees what the lines before it wrote. The service
-- sends the release lines that are ready, of many rejected events, as one call,
-- on a single Redis or a Sentinel primary with redis.wait_replicas = 0 (as
-- deduct_batch.lua and rollback_batch.lua).
--
-- KEYS[4i+1 .. 4i+4]  line i's KEYS[1..4] of release.lua (promotion, used, record,
--                     memo)
-- ARGV[1]             count  N, a positive canonical integer, #KEYS == 4 N
-- ARGV[3i+2 .. 3i+4]  line i's ARGV[1..3] of release.lua
--
-- Reply: N elements, line i's release.lua reply, or {"ERR", message} where
--   release.lua would have replied with an error (BADARG, CORRUPT, or a Redis error
--   of a command): one line's error never stops the lines after it, as separate
--   calls would not.
--
-- Error replies: "BADARG <what>" (the count does not match the keys and arguments):
--   nothing written.
--
-- Loaded as lua/lib.lua, then `local function release_one(KEYS, ARGV)` around
-- lua/release.lua, then this file (src/ledger/scripts.rs).

local n = tonumber(ARGV[1])
if n == nil or n < 1 or n ~= math.floor(n) or #KEYS ~= 4 * n or #ARGV ~= 1 + 3 * n then
  return redis.error_reply('BADARG batch of ' .. tostring(ARGV[1]) .. ' lines with '
    .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end

local out = {}
for i = 0, n - 1 do
  out[i + 1] = batch_element(pcall(release_one,
    { KEYS[4 * i + 1], KEYS[4 * i + 2], KEYS[4 * i + 3], KEYS[4 * i + 4] },
    { ARGV[3 * i + 2], ARGV[3 * i + 3], ARGV[3 * i + 4] }))
end
return out
