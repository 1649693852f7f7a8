-- memo_batch.lua: N reads of memo.lua in one call (issue 27: script calls per
-- event). A multi-line placement reads the stored rejections of its lines after the
-- first before it deducts anything (memo.lua); on a single Redis or a Sentinel
-- primary the service sends the reads that are ready, of many events, as one call
-- of this script, as it sends placement lines as one call of deduct_batch.lua. Not
-- on a Redis Cluster: the keys are of many promotions, so of many slots.
--
-- KEYS[1 .. N]  memo.lua's KEYS[1] of each read (promotion P's memo of event E),
--               N >= 1
-- ARGV          none
--
-- Reply: N elements, element i memo.lua's reply for KEYS[i] (the stored reason, or
--   ""), or {"ERR", message} where memo.lua would have replied with an error
--   (CORRUPT, or a Redis error of its GET): one key's error never stops the keys
--   after it, as separate calls would not.
--
-- Error replies: "BADARG <what>" (no key, or an argument). Read only.
--
-- Loaded as lua/lib.lua, then `local function memo_one(KEYS, ARGV)` around
-- lua/memo.lua, then this file (src/ledger/scripts.rs): each key is read by
-- memo.lua's body, unchanged.

local function main()
  if #KEYS < 1 then fail('BADARG expected at least 1 key, got 0') end
  if #ARGV ~= 0 then fail('BADARG expected no arguments, got ' .. #ARGV) end
  local out, none = {}, {}
  for i = 1, #KEYS do
    out[i] = batch_element(pcall(memo_one, { KEYS[i] }, none))
  end
  return out
end

return run(main)
