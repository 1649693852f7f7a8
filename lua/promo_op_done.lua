-- promo_op_done.lua: finishes an operator's change of a bucketed promotion
-- (`promo adjust` or `promo rebalance`, docs/contract.md section 2b) in one step.
-- The change is listed in the promotion's directory (field `op:<id>`) before its
-- walk runs, so that the command run again or the service's sweeper finishes one
-- that stopped half way. When the directory still lists it, this removes it and
-- moves `initial_budget` / `initial_stock` by what the change added or took away;
-- else (another finisher was first) it changes nothing. So the initial amounts
-- move once whoever finishes the change, and however many finish it at once.
--
-- KEYS[1] directory  promo:{P}  hash
-- ARGV[1] field      "op:<id>"
-- ARGV[2] budget     signed delta of initial_budget ("0": none)
-- ARGV[3] stock      signed delta of initial_stock
--
-- Reply: 1 when this call finished the change, 0 when it was finished before.
-- Error replies: "BADARG <what>" (nothing read or written).

-- The helpers (fail, show, signed, run) are lua/lib.lua's, prepended to this
-- script when it is loaded.

local function main()
  if #KEYS ~= 1 then fail('BADARG expected 1 key, got ' .. #KEYS) end
  if #ARGV ~= 3 then fail('BADARG expected 3 arguments, got ' .. #ARGV) end
  local field = ARGV[1]
  if string.sub(field, 1, 3) ~= 'op:' or #field < 4 then fail('BADARG field: ' .. show(field)) end
  for i = 2, 3 do
    if not signed(ARGV[i]) then fail('BADARG delta: ' .. show(ARGV[i])) end
  end
  if redis.call('HDEL', KEYS[1], field) == 0 then return 0 end
  if ARGV[2] ~= '0' then redis.call('HINCRBY', KEYS[1], 'initial_budget', ARGV[2]) end
  if ARGV[3] ~= '0' then redis.call('HINCRBY', KEYS[1], 'initial_stock', ARGV[3]) end
  return 1
end

return run(main)
