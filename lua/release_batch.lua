-- release_batch.lua: N lines of release.lua in one call (issue 27: script calls
-- per event), decided one after another in the order given, exactly as N calls of
-- release.lua in a row would be: release.lua's body runs unchanged as
-- `release_one(KEYS, ARGV)` for each line (but the one case below), every read
-- and write going to Redis line by line, so each line sees what the lines before
-- it wrote. The service
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

-- The plain release (issue 27: Redis time per line): the record is this event's
-- own deduction, with no absorbed event and no refund result, for this customer
-- (or one written before records named theirs). release.lua gives back its
-- budget and stock, its per-customer slot, deletes the record and marks the memo;
-- its per-call set-up (closures, pcall layers, the absorbed events' bookkeeping)
-- cost more than that. This decides it as release.lua does: the same reads in the
-- same order (promotion, used, record, memo), the same writes in the same order
-- and the same reply. Any other line (no record, another event's, absorbed events,
-- refund results, another customer, corrupt data, a malformed argument) is handed,
-- before anything of it is written, to release.lua's body: nil.
--
-- The promotions these in-line lines read (lib.lua's kept_promotion), parsed and
-- checked once a call; `credit` keeps a kept table's budget and stock equal to the
-- hash's, and an in-line line writes the promotion only through it. A line handed
-- over (whose body writes as it will) or failed empties it.
local promos = {}
local function plain(kb, ab)
  local event, ttl, customer = ARGV[ab + 1], ARGV[ab + 2], ARGV[ab + 3]
  if not (event_id(event) and ttl ~= '0' and canonical(ttl) and event_id(customer)) then return nil end
  local k_promo, k_used, k_record, k_memo = KEYS[kb + 1], KEYS[kb + 2], KEYS[kb + 3], KEYS[kb + 4]
  local ok, promo = kept_promotion(promos, k_promo)
  if not ok then return nil end
  local used
  ok, used = pcall(read_used, k_used)
  if not ok then return nil end
  local rec
  ok, rec = pcall(read_record, k_record)
  if not ok or rec == nil or rec.state ~= 'deducted' or rec.event ~= event or rec.absorbed ~= nil
      or (rec.customer ~= nil and rec.customer ~= customer) then
    return nil
  end
  for f in pairs(rec.fields) do
    if string.sub(f, 1, 7) == 'refund:' or string.sub(f, 1, 9) == 'absorbed:' then return nil end
  end
  local memo = redis.pcall('GET', k_memo)
  if type(memo) == 'table' or (memo ~= false and memo ~= ABSORBED and memo ~= RELEASED and not REASONS[memo]) then
    return nil
  end
  if same_incarnation(promo, rec) then
    credit(k_promo, promo, 'budget', rec.budget)
    credit(k_promo, promo, 'stock', rec.stock)
  end
  if rec.counted ~= false and used and used > 0 then redis.call('DECR', k_used) end
  redis.call('DEL', k_record)
  if memo == false or memo == ABSORBED then redis.call('SET', k_memo, RELEASED, 'EX', ttl) end
  return { 1 }
end

local out = {}
for i = 0, n - 1 do
  -- An error raised in `plain` (a refused write) is the line's error, as
  -- release.lua's would be; nil hands the line to its body.
  local ok, r = pcall(plain, 4 * i, 1 + 3 * i)
  if not ok or r == nil then promos = {} end
  if ok and r == nil then
    ok, r = pcall(release_one,
      { KEYS[4 * i + 1], KEYS[4 * i + 2], KEYS[4 * i + 3], KEYS[4 * i + 4] },
      { ARGV[3 * i + 2], ARGV[3 * i + 3], ARGV[3 * i + 4] })
  end
  out[i + 1] = batch_element(ok, r)
end
return out
