-- memo.lua: read the stored rejection of placement event E on one line, so that a
-- redelivered multi-line placement repeats its decision before deducting anything
-- (CONTRACT.md section 3, "one decision per event"). A script rather than a GET so
-- that a least-privilege ACL user needs nothing but EVAL/EVALSHA.
--
-- KEYS[1] memo  promo:{P}:rejected:{E}  string: a rejection reason, or "accepted"
--                                       (deduct.lua step 1 absorbed E: not a rejection)
--                                       or "released" (release.lua: not the reason either)
-- ARGV    none
--
-- Reply: the stored reason, or "" when E was not rejected on this line.
--
-- Error replies: "BADARG <what>", "CORRUPT <key> <field>: <value>". Read only.

-- The helpers (fail, read_string, REASONS, ...) are lua/lib.lua's, prepended
-- to this script when it is loaded.

local function main()
  if #KEYS ~= 1 then fail('BADARG expected 1 key, got ' .. #KEYS) end
  if #ARGV ~= 0 then fail('BADARG expected no arguments, got ' .. #ARGV) end
  local v = read_string(KEYS[1])
  if v == nil or v == ABSORBED or v == RELEASED then return '' end
  if not REASONS[v] then corrupt(KEYS[1], 'value', v) end
  return v
end

return run(main)
