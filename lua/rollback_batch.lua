-- rollback_batch.lua: N lines of rollback.lua in one call (issue 27: script calls
-- per event), decided one after another in the order given, exactly as N calls of
-- rollback.lua in a row would be: rollback.lua's body runs unchanged as
-- `rollback_one(KEYS, ARGV)` for each line (but the one case below), every read
-- and write going to Redis line by line, so each line sees what the lines before
-- it wrote. The service
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

-- The refund with nothing to give back (issue 27: Redis time per line): a new
-- refund event of an order that has no record, which rollback.lua answers
-- `rejected no_deduction` and remembers in a tombstone record. On a flash sale
-- most refunds are of rejected orders, and rollback.lua's per-call set-up (its
-- argument table, closures and pcall layers) cost more than the decision. This
-- decides it as rollback.lua's steps 1 and 2 do: the same reads in the same order
-- (memo, record, promotion, used), the same writes (the index, then the
-- tombstone) and the same reply. Any other line (a memo or a record exists, a
-- key of another type, corrupt data, a malformed argument) is handed, before
-- anything of it is written, to rollback.lua's body: nil.
--
-- The promotions these in-line lines read (lib.lua's kept_promotion), parsed and
-- checked once a call: an in-line line writes no promotion, so a later one of the
-- same promotion would read the same hash. A line handed over (whose body may give
-- units back) or failed empties it.
local promos = {}
local function no_deduction(kb, ab)
  local budget, stock, record_ttl, refund_ttl = ARGV[ab + 1], ARGV[ab + 2], ARGV[ab + 3], ARGV[ab + 4]
  local event, customer = ARGV[ab + 5], ARGV[ab + 6]
  if not ((budget == '' or canonical(budget)) and (stock == '' or canonical(stock))
      and record_ttl ~= '0' and canonical(record_ttl) and refund_ttl ~= '0' and canonical(refund_ttl)
      and event_id(event) and event_id(customer)) then
    return nil
  end
  if nk == 5 and not (event_id(ARGV[ab + 7]) and ARGV[ab + 8] ~= '0' and canonical(ARGV[ab + 8])) then
    return nil
  end
  local k_promo, k_memo, k_record = KEYS[kb + 1], KEYS[kb + 4], KEYS[kb + 3]
  if redis.pcall('GET', k_memo) ~= false then return nil end
  if redis.pcall('GET', k_record) ~= false then return nil end
  local ok, promo = kept_promotion(promos, k_promo)
  if not ok or not pcall(read_used, KEYS[kb + 2]) then return nil end
  if nk == 5 then
    index_record(KEYS[kb + 5], ARGV[ab + 7], ARGV[ab + 8], record_ttl, function(read)
      remembering_corrupt(k_memo, 'rejected ' .. CORRUPT_REASON, refund_ttl, read)
    end)
  end
  -- rollback.lua's tombstone, refund:<E> = "rejected no_deduction", as write_record
  -- stores it.
  redis.call('SET', k_record, TOMBSTONE .. '|refund:' .. event .. '=rejected no_deduction', 'EX', record_ttl)
  if not promo then return { 'rejected', 'no_deduction', 0, 0, 0, -1, -1 } end
  return { 'rejected', 'no_deduction', 0, 0, 0, promo.budget or -1, promo.stock or -1 }
end

local out = {}
for i = 0, n - 1 do
  -- An error raised in `no_deduction` (a refused write, a corrupt index) is the
  -- line's error, as rollback.lua's would be; nil hands the line to its body.
  local ok, r = pcall(no_deduction, nk * i, 1 + na * i)
  if not ok or r == nil then promos = {} end
  if ok and r == nil then
    local keys, args = {}, {}
    for j = 1, nk do keys[j] = KEYS[nk * i + j] end
    for j = 1, na do args[j] = ARGV[1 + na * i + j] end
    ok, r = pcall(rollback_one, keys, args)
  end
  out[i + 1] = batch_element(ok, r)
end
return out
