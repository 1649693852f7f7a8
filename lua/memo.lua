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

local REASONS = {
  budget_exceeded = true, stock_insufficient = true, user_limit_reached = true,
  promotion_not_found = true, promotion_inactive = true, order_reverted = true,
}

local function show(v)
  v = tostring(v)
  if #v > 64 then v = string.sub(v, 1, 64) .. '...' end
  return (string.gsub(v, '%c', '?'))
end

if #KEYS ~= 1 then return redis.error_reply('BADARG expected 1 key, got ' .. #KEYS) end
if #ARGV ~= 0 then return redis.error_reply('BADARG expected no arguments, got ' .. #ARGV) end
local key = KEYS[1]
local v = redis.pcall('GET', key)
if type(v) == 'table' and v.err then
  -- Only a wrong key type is corrupt data; other errors keep their own code.
  if string.sub(v.err, 1, 9) ~= 'WRONGTYPE' then return redis.error_reply(v.err) end
  local t = redis.pcall('TYPE', key)
  return redis.error_reply('CORRUPT ' .. key .. ' type: ' .. show(type(t) == 'table' and t.ok or v.err))
end
if v == false or v == 'accepted' or v == 'released' then return '' end
if not REASONS[v] then return redis.error_reply('CORRUPT ' .. key .. ' value: ' .. show(v)) end
return v
