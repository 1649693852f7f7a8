-- bucket.lua: one step of the bucket protocol (docs/buckets.md, issue 28) on one
-- bucket of a bucketed promotion. Each call is one operation (ARGV[1]) on the
-- bucket whose hash is KEYS[1] = promo:{P~k}; it reads and writes keys of that
-- bucket's slot only. The operations, their arguments and replies are those of
-- the model in tests/it/ledger/buckets/bucket.rs (`Op`, `Reply`), which a
-- differential test holds this script to, call by call.
--
-- The service runs it for every line of a bucketed promotion (src/ledger/buckets.rs);
-- docs/contract.md section 2b gives its keys and rules.
--
-- KEYS[1] bucket  promo:{P~k}   hash: budget, stock (free), held_budget, held_stock (given,
--                               not settled), set_budget, set_stock (set aside, waiting for a
--                               reservation), incr, notify (counters), bound:<j> = "b,s"
--                               (an upper bound of bucket j), index (k), buckets (K),
--                               per_customer (absent: no limit), status, starts_at,
--                               ends_at (copies of the promotion's, written by promo set,
--                               pause and resume)
-- Every other key is KEYS[1] followed by a suffix, so it is in the same slot:
--   :order:{O}     the order's record (below)          :rejected:{E}  the event's memo
--   :attempt:{E}   the event's gather attempt          :refund:{E}    a refund's decision
--   :pending       set: ids whose units are on their way here
--   :gift:{E}:{a}  a gift given from here: "g|b|s|R" given, "s|b|s|R" settled (b, s what the
--                  decision consumed), "r|R" returned; R the receiver's index
--   :open, :holding  sorted sets (lex, score 0) of "E#a": the given gifts, and those of them
--                  holding units (the seniority and "holds" questions)
--   :resv:{O} "h|C" held or "f|C" freed; :used:{C} the held count; :refused:{O}
--   :in:{T}, :out:{T}  "b,s" a transfer or adjustment credited here / took from here
-- Records: "t|C|b|s|ob|os|CR" set aside (ob, os of this bucket's own units),
-- "d|C|b|s|CR" deducted, "v|C|b|s|CR|by" reverted by refund `by`, "x|by" a tombstone,
-- "r|C|b|s|CR" released; CR the credits consumed, "j:a:b:s" joined by ";".
--
-- ARGV[1] the operation, ARGV[2] the TTL in seconds of every key it writes but the
-- bucket hash and its sets, ARGV[3..] the operation's arguments (see each below).
-- Replies: a flat array, its first element the reply's kind (see `Reply`).
--
-- Corrupt data: a counter of the bucket hash that is not a canonical integer
-- makes the bucket corrupt; an operation that needs the counters then replies
-- {"corrupt"} and writes nothing, or, where it decides, decides
-- corrupt_promotion under the event's memo. Any other stored value it cannot
-- read is the error "CORRUPT <key> ...": every operation reads all it needs
-- before its first write, so that error leaves every key as it was.
--
-- What runs is this text cut down per operation (src/ledger/scripts.rs
-- `specialize_bucket`): the other operations' `function OPS.X` and SIGNATURES
-- entries left out, then every top-level `local` nothing left names. Redis runs
-- a script's top level on every call, and each closure and table it builds
-- costs the server there (the whole script: about 250,000 instructions before
-- the operation began; `scripts/lua-cost --bucket`). So keep the layout that
-- cut relies on: a top-level function starts at column 0 (`local function` or
-- `function OPS.`) and ends at the next line that is exactly `end` (or is one
-- line); a top-level `local NAME = ...` table closes its braces on its last
-- line; no `--` inside a string, no block comments.

local B = KEYS[1]
local op = ARGV[1]
local ttl = ARGV[2]

local function split(s, sep)
  local out, start = {}, 1
  while true do
    local i = string.find(s, sep, start, true)
    if not i then
      out[#out + 1] = string.sub(s, start)
      return out
    end
    out[#out + 1] = string.sub(s, start, i - 1)
    start = i + 1
  end
end

-- A count: every argument is validated before the operation runs
-- (`check_args`), so a value that is not canonical here was read from a key
-- (named by `key`): corrupt data.
local function num(s, key)
  if not canonical(s) then corrupt(key or B, 'value', s) end
  return tonumber(s)
end

-- Units: {budget, stock}.
local function U(b, s) return { b, s } end
local function add(x, y) return { x[1] + y[1], x[2] + y[2] } end
local function sub(x, y) return { x[1] - y[1], x[2] - y[2] } end
local function umin(x, y) return { math.min(x[1], y[1]), math.min(x[2], y[2]) } end
local function pos(x) return { math.max(x[1], 0), math.max(x[2], 0) } end
local function any_pos(x) return x[1] > 0 or x[2] > 0 end
local function covers(x, need) return x[1] >= need[1] and x[2] >= need[2] end
local function short_of(x, need)
  if x[1] < need[1] then return 'budget_exceeded' end
  if x[2] < need[2] then return 'stock_insufficient' end
  return nil
end
local ZERO = U(0, 0)
local function ustr(x) return int(x[1]) .. ',' .. int(x[2]) end
local function uparse(s, key)
  local p = split(s, ',')
  if #p ~= 2 then corrupt(key or B, 'value', s) end
  return U(num(p[1], key), num(p[2], key))
end

local function get(key)
  local v = redis.call('GET', key)
  if v == false then return nil end
  return v
end
local function put(key, v) redis.call('SET', key, v, 'EX', ttl) end

-- The bucket's counters, or nil when one is corrupt.
local COUNTERS = { 'budget', 'stock', 'held_budget', 'held_stock', 'set_budget', 'set_stock', 'incr',
  'notify' }
local function read_bucket()
  local h = read_hash(B)
  if h == nil then fail('NOBUCKET ' .. B) end
  -- k.stored: the counters as the hash holds them (nil: absent), for save.
  local k, stored = {}, {}
  for _, f in ipairs(COUNTERS) do
    local v = h[f]
    if v == nil then
      k[f] = 0
    else
      if not canonical(v) then return nil, h end
      k[f] = tonumber(v)
      stored[f] = k[f]
    end
  end
  k.stored = stored
  k.avail = U(k.budget, k.stock)
  k.held = U(k.held_budget, k.held_stock)
  k.set = U(k.set_budget, k.set_stock)
  return k, h
end
-- Adds field f = v to the HSET arguments `args` when the hash holds
-- another value (or none).
local function changed(args, stored, f, v)
  if v ~= stored[f] then
    args[#args + 1] = f
    args[#args + 1] = int(v)
    stored[f] = v
  end
end
-- Writes the counters that differ from what the hash holds (an absent one
-- included): the same hash as writing all eight, in fewer arguments.
local function save(k)
  local args, st = {}, k.stored
  changed(args, st, 'budget', k.avail[1])
  changed(args, st, 'stock', k.avail[2])
  changed(args, st, 'held_budget', k.held[1])
  changed(args, st, 'held_stock', k.held[2])
  changed(args, st, 'set_budget', k.set[1])
  changed(args, st, 'set_stock', k.set[2])
  changed(args, st, 'incr', k.incr)
  changed(args, st, 'notify', k.notify)
  if #args > 0 then redis.call('HSET', B, unpack(args)) end
end
local function config(h, field)
  local v = h[field]
  if v == nil then return nil end
  return num(v)
end

-- Records.
local RECORD_WIDTH = { t = 7, d = 5, v = 6, x = 2, r = 5 }
local function record(o)
  local key = B .. ':order:' .. o
  local v = get(key)
  if v == nil then return nil end
  local p = split(v, '|')
  local r = { state = p[1] }
  if RECORD_WIDTH[r.state] ~= #p then corrupt(key, 'value', v) end
  if r.state == 'x' then
    r.by = p[2]
  else
    r.customer, r.units = p[2], U(num(p[3], key), num(p[4], key))
    if r.state == 't' then
      r.own, r.cr = U(num(p[5], key), num(p[6], key)), p[7]
    else
      r.cr = p[5]
      if r.state == 'v' then r.by = p[6] end
    end
  end
  return r
end
local function put_record(o, r)
  local v
  if r.state == 'x' then
    v = 'x|' .. r.by
  else
    v = r.state .. '|' .. r.customer .. '|' .. int(r.units[1]) .. '|' .. int(r.units[2])
    if r.state == 't' then
      v = v .. '|' .. int(r.own[1]) .. '|' .. int(r.own[2]) .. '|' .. r.cr
    else
      v = v .. '|' .. r.cr
      if r.state == 'v' then v = v .. '|' .. r.by end
    end
  end
  put(B .. ':order:' .. o, v)
end

local function memo(e) return get(B .. ':rejected:' .. e) end
local function attempt(e)
  local key = B .. ':attempt:' .. e
  local v = get(key)
  if v == nil then return nil end
  return num(v, key)
end
local function pending() return redis.call('SCARD', B .. ':pending') > 0 end

-- Gifts.
local function gift(e, a)
  local key = B .. ':gift:' .. e .. ':' .. a
  local v = get(key)
  if v == nil then return nil end
  local p = split(v, '|')
  if p[1] == 'r' and #p == 2 then return { state = 'r', to = p[2] } end
  if (p[1] ~= 'g' and p[1] ~= 's') or #p ~= 4 then corrupt(key, 'value', v) end
  return { state = p[1], units = U(num(p[2], key), num(p[3], key)), to = p[4] }
end
local function write_gift(e, a, g)
  local m = e .. '#' .. a
  if g.state == 'r' then
    put(B .. ':gift:' .. e .. ':' .. a, 'r|' .. g.to)
  else
    put(B .. ':gift:' .. e .. ':' .. a, g.state .. '|' .. int(g.units[1]) .. '|' .. int(g.units[2]) .. '|' .. g.to)
  end
  if g.state == 'g' then
    redis.call('ZADD', B .. ':open', 0, m)
    if any_pos(g.units) then
      redis.call('ZADD', B .. ':holding', 0, m)
    else
      redis.call('ZREM', B .. ':holding', m)
    end
  else
    redis.call('ZREM', B .. ':open', m)
    redis.call('ZREM', B .. ':holding', m)
  end
end
-- The attempts of event e with a gift still given here, ascending.
local function open_attempts(e)
  local ms = redis.call('ZRANGEBYLEX', B .. ':open', '[' .. e .. '#', '(' .. e .. '$')
  local as = {}
  for _, m in ipairs(ms) do as[#as + 1] = num(string.sub(m, #e + 2), B .. ':open') end
  table.sort(as)
  return as
end
-- A line with a lower id holds units given here.
local function senior_holds(e)
  return #redis.call('ZRANGEBYLEX', B .. ':holding', '-', '(' .. e .. '#', 'LIMIT', 0, 1) > 0
end
local function holds(e)
  return #redis.call('ZRANGEBYLEX', B .. ':holding', '[' .. e .. '#', '(' .. e .. '$', 'LIMIT', 0, 1) > 0
end
-- The event's gifts still given here, read before anything is written
-- ({a, gift} by ascending attempt; a member whose key has expired is
-- skipped).
local function open_gifts(e)
  local out = {}
  for _, a in ipairs(open_attempts(e)) do
    local g = gift(e, a)
    if g ~= nil and g.state == 'g' then out[#out + 1] = { a, g } end
  end
  return out
end

-- Gift (e, a), as read (`g`), goes back if it is still given.
local function give_back(k, e, a, g)
  if g == nil or g.state ~= 'g' then return end
  if any_pos(g.units) then
    k.avail = add(k.avail, g.units)
    k.held = sub(k.held, g.units)
    k.incr = k.incr + 1
  end
  write_gift(e, a, { state = 'r', to = g.to })
end

local function b01(x) if x then return 1 end return 0 end
local function decided_reply(reason, units, cr)
  return { 'decided', reason, int(units[1]), int(units[2]), cr }
end

-- An earlier decision at this bucket: its memo, or its record; and the
-- record as read (nil when there is none or a memo answered).
local function decided(e)
  local m = memo(e)
  if m ~= nil then return decided_reply(m, ZERO, ''), nil end
  local r = record(e)
  if r and (r.state == 'd' or r.state == 'v') then return decided_reply('accepted', r.units, r.cr), r end
  if r and r.state == 'r' then return decided_reply('released', ZERO, r.cr), r end
  return nil, r
end

-- decided(), then a tombstone (rejected order_reverted, remembered), then a
-- tentative deduction waiting for its reservation.
local function home_checks(e)
  local d, r = decided(e)
  if d then return d end
  if r and r.state == 'x' then
    put(B .. ':rejected:' .. e, 'order_reverted')
    return decided_reply('order_reverted', ZERO, '')
  end
  if r and r.state == 't' then return { 'tentative' } end
  return nil
end

local function decide_corrupt(e)
  put(B .. ':rejected:' .. e, 'corrupt_promotion')
  return decided_reply('corrupt_promotion', ZERO, '')
end

-- The tentative deduction `r` of event e (its record as read) made final.
local function settle(k, e, r)
  if r == nil or r.state ~= 't' then return { 'restart' } end
  k.set = sub(k.set, r.own)
  save(k)
  put_record(e, { state = 'd', customer = r.customer, units = r.units, cr = r.cr })
  return decided_reply('accepted', r.units, r.cr)
end

-- Takes `own` of this bucket's units for the line: set aside for its
-- reservation under a per-customer limit, else deducted there and then (the
-- same keys as setting aside and settling at once).
local function take(k, h, e, c, units, own, cr)
  local limited = config(h, 'per_customer') ~= nil
  k.avail = sub(k.avail, own)
  if limited then
    k.set = add(k.set, own)
    put_record(e, { state = 't', customer = c, units = units, own = own, cr = cr })
    save(k)
    return { 'tentative' }
  end
  save(k)
  put_record(e, { state = 'd', customer = c, units = units, cr = cr })
  return decided_reply('accepted', units, cr)
end

local function bounds_str(h, kk)
  local parts = {}
  for m = 0, kk - 1 do parts[#parts + 1] = h['bound:' .. m] or '-' end
  return table.concat(parts, ';')
end

-- "j:a:b:s;..." -> list of {j, a, units}
local function parse_credits(cr)
  local out = {}
  if cr == '' then return out end
  for _, c in ipairs(split(cr, ';')) do
    local p = split(c, ':')
    out[#out + 1] = { num(p[1]), num(p[2]), U(num(p[3]), num(p[4])) }
  end
  return out
end

local OPS = {}

-- Start E C b s t (t: the event's business time, unix seconds)
function OPS.Start(e, c, b, s, t)
  local units = U(num(b), num(s))
  local hc = home_checks(e)
  if hc then return hc end
  local k, h = read_bucket()
  if k == nil then return decide_corrupt(e) end
  -- The promotion's status and window, copied into every bucket (promo set, pause,
  -- resume): checked as deduct.lua's step 4, remembered like any rejection.
  local status, from, to = h.status or 'active', config(h, 'starts_at'), config(h, 'ends_at')
  if status ~= 'active' and status ~= 'paused' then return decide_corrupt(e) end
  t = num(t)
  if status == 'paused' or (from and t < from) or (to and t >= to) then
    put(B .. ':rejected:' .. e, 'promotion_inactive')
    return decided_reply('promotion_inactive', ZERO, '')
  end
  if covers(k.avail, units) then return take(k, h, e, c, units, units, '') end
  local j, kk = config(h, 'index'), config(h, 'buckets')
  local bound = ZERO
  for m = 0, kk - 1 do
    if m ~= j then
      local x = h['bound:' .. m]
      if x == nil then
        bound = nil
        break
      end
      bound = add(bound, uparse(x))
    end
  end
  if bound ~= nil then
    local dim = short_of(add(add(add(k.avail, k.held), k.set), bound), units)
    if dim and not pending() then
      put(B .. ':rejected:' .. e, dim)
      return { 'short', dim, 1 }
    end
  end
  if kk == 1 then
    if any_pos(add(k.set, k.held)) or pending() then return { 'wait' } end
    local dim = short_of(k.avail, units) or 'stock_insufficient'
    put(B .. ':rejected:' .. e, dim)
    return { 'short', dim, 0 }
  end
  local a = attempt(e)
  if a == nil then
    a = 0
    put(B .. ':attempt:' .. e, '0')
  end
  local held = add(k.held, k.set)
  return { 'gather', int(a), int(k.incr), int(k.notify), int(k.avail[1]), int(k.avail[2]),
    int(held[1]), int(held[2]), b01(pending()), b01(senior_holds(e)), bounds_str(h, kk) }
end

-- Peek E
function OPS.Peek(e)
  local k = read_bucket()
  local avail, held = ZERO, ZERO
  if k then avail, held = k.avail, add(k.held, k.set) end
  return { 'peeked', b01(k == nil), int(avail[1]), int(avail[2]), int(held[1]), int(held[2]),
    b01(holds(e)), b01(pending()), b01(senior_holds(e)) }
end

-- Reject E a incr notify dim saw_corrupt seen ("m:b:s;...")
function OPS.Reject(e, a, incr, notify, dim, saw_corrupt, seen)
  local hc = home_checks(e)
  if hc then return hc end
  local k = read_bucket()
  if k == nil then return decide_corrupt(e) end
  if attempt(e) ~= num(a) or k.incr ~= num(incr) or pending() or k.notify ~= num(notify) then
    return { 'restart' }
  end
  if saw_corrupt == '1' then return decide_corrupt(e) end
  put(B .. ':rejected:' .. e, dim)
  if seen ~= '' then
    for _, x in ipairs(split(seen, ';')) do
      local p = split(x, ':')
      redis.call('HSET', B, 'bound:' .. p[1], p[2] .. ',' .. p[3])
    end
  end
  return { 'short', dim, 0 }
end

-- Give E a b s receiver
function OPS.Give(e, a, b, s, receiver)
  local want = U(num(b), num(s))
  a = num(a)
  local k = read_bucket()
  if k == nil then return { 'corrupt' } end
  local stale = open_gifts(e)
  local senior = b01(senior_holds(e))
  local g0 = gift(e, a)
  -- A gift of an earlier attempt can never be credited: it goes back first.
  for _, x in ipairs(stale) do
    if x[1] < a then give_back(k, e, x[1], x[2]) end
  end
  local had = ZERO
  if g0 and g0.state == 's' then
    save(k)
    return { 'gave', int(g0.units[1]), int(g0.units[2]), senior }
  elseif g0 and g0.state == 'r' then
    save(k)
    return { 'gave', '0', '0', senior }
  elseif g0 then
    had = g0.units
  end
  local g = pos(umin(k.avail, want))
  k.avail = sub(k.avail, g)
  k.held = add(k.held, g)
  save(k)
  local total = add(had, g)
  write_gift(e, a, { state = 'g', units = total, to = receiver })
  return { 'gave', int(total[1]), int(total[2]), senior }
end

-- Accept E C b s a mine ("m:b:s;...", ascending m)
function OPS.Accept(e, c, b, s, a, mine)
  local units = U(num(b), num(s))
  a = num(a)
  local hc = home_checks(e)
  if hc then return hc end
  local k, h = read_bucket()
  if k == nil then return decide_corrupt(e) end
  if attempt(e) ~= a then return { 'yield' } end
  local gifts, sum = {}, ZERO
  if mine ~= '' then
    for _, x in ipairs(split(mine, ';')) do
      local p = split(x, ':')
      local u = U(num(p[2]), num(p[3]))
      gifts[#gifts + 1] = { p[1], u }
      sum = add(sum, u)
    end
  end
  if not covers(add(k.avail, sum), units) then return { 'restart' } end
  local from_home = umin(k.avail, units)
  local need = sub(units, from_home)
  local credits = {}
  for _, g in ipairs(gifts) do
    local t = umin(need, g[2])
    if any_pos(t) then
      credits[#credits + 1] = g[1] .. ':' .. int(a) .. ':' .. int(t[1]) .. ':' .. int(t[2])
      need = sub(need, t)
    end
  end
  return take(k, h, e, c, units, from_home, table.concat(credits, ';'))
end

-- Yield E a
function OPS.Yield(e, a)
  local hc = home_checks(e)
  if hc then return hc end
  if attempt(e) == num(a) then put(B .. ':attempt:' .. e, int(num(a) + 1)) end
  return { 'ok' }
end

-- ReturnAll E upto
function OPS.ReturnAll(e, upto)
  local k = read_bucket()
  if k == nil then return { 'corrupt' } end
  upto = num(upto)
  for _, x in ipairs(open_gifts(e)) do
    if x[1] <= upto then give_back(k, e, x[1], x[2]) end
  end
  save(k)
  return { 'ok' }
end

-- Reserve O C (at the customer's bucket)
function OPS.Reserve(o, c)
  local limit = redis.call('HGET', B, 'per_customer')
  if limit == false then limit = math.huge else limit = num(limit, B) end
  if redis.call('EXISTS', B .. ':refused:' .. o) == 1 then return { 'reserved', 0, 0 } end
  if redis.call('EXISTS', B .. ':resv:' .. o) == 1 then return { 'reserved', 1, 0 } end
  local used = num(get(B .. ':used:' .. c) or '0', B .. ':used:' .. c)
  if used < limit then
    put(B .. ':resv:' .. o, 'h|' .. c)
    put(B .. ':used:' .. c, int(used + 1))
    return { 'reserved', 1, 0 }
  end
  put(B .. ':refused:' .. o, '1')
  return { 'reserved', 0, 1 }
end

-- Settle E
function OPS.Settle(e)
  local d, r = decided(e)
  if d then return d end
  local k = read_bucket()
  if k == nil then return { 'corrupt' } end
  return settle(k, e, r)
end

-- Undo E
function OPS.Undo(e)
  local d, r = decided(e)
  if d then return d end
  local k = read_bucket()
  if k == nil then return { 'corrupt' } end
  if r == nil or r.state ~= 't' then return { 'restart' } end
  redis.call('DEL', B .. ':order:' .. e)
  k.set = sub(k.set, r.own)
  if any_pos(r.own) then
    k.avail = add(k.avail, r.own)
    k.incr = k.incr + 1
  end
  save(k)
  put(B .. ':rejected:' .. e, 'user_limit_reached')
  return decided_reply('user_limit_reached', ZERO, '')
end

-- Unreserve O (at the customer's bucket)
function OPS.Unreserve(o)
  local v = get(B .. ':resv:' .. o)
  if v ~= nil and string.sub(v, 1, 2) == 'h|' then
    local c = string.sub(v, 3)
    local used = num(get(B .. ':used:' .. c) or '0', B .. ':used:' .. c)
    put(B .. ':resv:' .. o, 'f|' .. c)
    put(B .. ':used:' .. c, int(used - 1))
  end
  return { 'ok' }
end

-- Settle bucket k's gifts of event e after its decision: what `credited`
-- consumed is settled, the rest goes back.
local function settle_event(k, j, e, credited)
  for _, x in ipairs(open_gifts(e)) do
    local a, g = x[1], x[2]
    local used = ZERO
    for _, c in ipairs(credited) do
      if c[1] == j and c[2] == a then used = add(used, c[3]) end
    end
    local back = sub(g.units, used)
    k.held = sub(k.held, g.units)
    if any_pos(back) then
      k.avail = add(k.avail, back)
      k.incr = k.incr + 1
    end
    write_gift(e, a, { state = 's', units = used, to = g.to })
  end
end

-- Cleanup E credited
function OPS.Cleanup(e, cr)
  local k, h = read_bucket()
  if k == nil then return { 'corrupt' } end
  settle_event(k, config(h, 'index'), e, parse_credits(cr))
  save(k)
  return { 'ok' }
end

local function refund_memo(e) return get(B .. ':refund:' .. e) end

-- RefundLook E O
function OPS.RefundLook(e, o)
  if refund_memo(e) == 'corrupt' then return { 'refund', 'corrupt', '0', '0' } end
  local r = record(o)
  local pend = B .. ':pending'
  if r == nil then
    put_record(o, { state = 'x', by = e })
    put(B .. ':refund:' .. e, 'no_deduction')
    return { 'refund', 'no_deduction', '0', '0' }
  elseif r.state == 'v' and r.by == e then
    redis.call('SREM', pend, e)
    return { 'release', r.customer, int(r.units[1]), int(r.units[2]) }
  elseif r.state == 'v' then
    redis.call('SREM', pend, e)
    return { 'refund', 'already_reverted', '0', '0' }
  elseif r.state == 'd' then
    if read_bucket() == nil then
      redis.call('SREM', pend, e)
      put(B .. ':refund:' .. e, 'corrupt')
      return { 'refund', 'corrupt', '0', '0' }
    end
    redis.call('SADD', pend, e)
    return { 'marked', int(r.units[1]), int(r.units[2]) }
  elseif r.state == 't' then
    return { 'wait' }
  elseif r.state == 'r' then
    redis.call('SREM', pend, e)
    return { 'refund', 'no_deduction', '0', '0' }
  end
  return { 'refund', 'no_deduction', '0', '0' }
end

-- Notify to b s
function OPS.Notify(to, b, s)
  local k, h = read_bucket()
  if k == nil then return { 'corrupt' } end
  local x = h['bound:' .. to]
  if x ~= nil then x = ustr(add(uparse(x), U(num(b), num(s)))) end
  k.notify = k.notify + 1
  save(k)
  if x ~= nil then redis.call('HSET', B, 'bound:' .. to, x) end
  return { 'ok' }
end

-- A deduction of order o goes back here; its record becomes `state` (and `by`).
local function give_back_record(k, o, r, state, by)
  k.avail = add(k.avail, r.units)
  k.incr = k.incr + 1
  save(k)
  put_record(o, { state = state, customer = r.customer, units = r.units, cr = r.cr, by = by })
end

-- RefundRevert E O
function OPS.RefundRevert(e, o)
  local memo_ = refund_memo(e)
  local k = read_bucket()
  local r = record(o)
  redis.call('SREM', B .. ':pending', e)
  if memo_ == 'corrupt' then return { 'refund', 'corrupt', '0', '0' } end
  if r == nil or r.state ~= 'd' then return { 'relook' } end
  if k == nil then
    put(B .. ':refund:' .. e, 'corrupt')
    return { 'refund', 'corrupt', '0', '0' }
  end
  give_back_record(k, o, r, 'v', e)
  put(B .. ':refund:' .. e, 'applied|' .. ustr(r.units))
  return { 'release', r.customer, int(r.units[1]), int(r.units[2]) }
end

-- ReleaseLook E
function OPS.ReleaseLook(e)
  local r = record(e)
  local pend = B .. ':pending'
  if r and r.state == 'd' then
    redis.call('SADD', pend, e)
    return { 'marked', int(r.units[1]), int(r.units[2]) }
  end
  redis.call('SREM', pend, e)
  if r and r.state == 'r' then return { 'release', r.customer, int(r.units[1]), int(r.units[2]) } end
  return { 'nothing' }
end

-- ReleaseRevert E
function OPS.ReleaseRevert(e)
  local k = read_bucket()
  if k == nil then return { 'corrupt' } end
  local r = record(e)
  redis.call('SREM', B .. ':pending', e)
  if r and r.state == 'd' then
    give_back_record(k, e, r, 'r')
    return { 'release', r.customer, int(r.units[1]), int(r.units[2]) }
  end
  if r and r.state == 'r' then return { 'release', r.customer, int(r.units[1]), int(r.units[2]) } end
  return { 'nothing' }
end

-- Memo E
function OPS.Memo(e)
  return { 'memo', memo(e) or '' }
end

local function credited_in(t)
  local key = B .. ':in:' .. t
  local v = get(key)
  if v == nil then return nil end
  return uparse(v, key)
end

-- TransferMark T (and AdjustMark T)
function OPS.TransferMark(t)
  local c = credited_in(t)
  if c then return { 'amount', int(c[1]), int(c[2]) } end
  redis.call('SADD', B .. ':pending', t)
  return { 'ok' }
end
OPS.AdjustMark = OPS.TransferMark

-- TransferTake T b s to
function OPS.TransferTake(t, b, s, to)
  local k = read_bucket()
  if k == nil then return { 'corrupt' } end
  local g0 = gift(t, 0)
  if g0 and g0.state == 'r' then return { 'amount', '0', '0' } end
  if g0 then return { 'amount', int(g0.units[1]), int(g0.units[2]) } end
  local g = pos(umin(k.avail, U(num(b), num(s))))
  k.avail = sub(k.avail, g)
  k.held = add(k.held, g)
  save(k)
  write_gift(t, 0, { state = 'g', units = g, to = to })
  return { 'amount', int(g[1]), int(g[2]) }
end

-- TransferCredit T from b s
function OPS.TransferCredit(t, _from, b, s)
  local k = read_bucket()
  if k == nil then return { 'corrupt' } end
  local c = credited_in(t)
  redis.call('SREM', B .. ':pending', t)
  if c then return { 'amount', int(c[1]), int(c[2]) } end
  local took = U(num(b), num(s))
  if any_pos(took) then
    k.avail = add(k.avail, took)
    k.incr = k.incr + 1
    save(k)
  end
  put(B .. ':in:' .. t, ustr(took))
  return { 'amount', int(took[1]), int(took[2]) }
end

-- TransferSettle T b s
function OPS.TransferSettle(t, b, s)
  local k = read_bucket()
  if k == nil then return { 'corrupt' } end
  local c = U(num(b), num(s))
  local g = gift(t, 0)
  if g and g.state == 'g' then
    k.held = sub(k.held, g.units)
    local back = sub(g.units, c)
    if any_pos(back) then
      k.avail = add(k.avail, back)
      k.incr = k.incr + 1
    end
    save(k)
    write_gift(t, 0, { state = 's', units = c, to = g.to })
  end
  return { 'ok' }
end

-- AdjustCredit T b s
function OPS.AdjustCredit(t, b, s)
  local k = read_bucket()
  if k == nil then return { 'corrupt' } end
  local c = credited_in(t)
  redis.call('SREM', B .. ':pending', t)
  if c == nil then
    local share = U(num(b), num(s))
    put(B .. ':in:' .. t, ustr(share))
    k.avail = add(k.avail, share)
    k.incr = k.incr + 1
    save(k)
  end
  return { 'ok' }
end

-- AdjustRemove T b s
function OPS.AdjustRemove(t, b, s)
  local k = read_bucket()
  if k == nil then return { 'corrupt' } end
  if get(B .. ':out:' .. t) == nil then
    local g = pos(umin(k.avail, U(num(b), num(s))))
    k.avail = sub(k.avail, g)
    save(k)
    put(B .. ':out:' .. t, ustr(g))
  end
  return { 'ok' }
end

-- OpenGifts: {"gifts", "E#a#R", ...}
function OPS.OpenGifts()
  if read_bucket() == nil then return { 'corrupt' } end
  local out = { 'gifts' }
  for _, m in ipairs(redis.call('ZRANGEBYLEX', B .. ':open', '-', '+')) do
    local i = string.find(m, '#', 1, true)
    if i == nil then corrupt(B .. ':open', 'member', m) end
    local g = gift(string.sub(m, 1, i - 1), string.sub(m, i + 1))
    if g ~= nil and g.state == 'g' then out[#out + 1] = m .. '#' .. g.to end
  end
  return out
end

-- EventState E: {"event", has a decision, its credits, attempt or ""}
function OPS.EventState(e)
  local r = record(e)
  local a = attempt(e)
  a = a and int(a) or ''
  if r and (r.state == 'd' or r.state == 'v' or r.state == 'r') then return { 'event', 1, r.cr, a } end
  if memo(e) ~= nil then return { 'event', 1, '', a } end
  return { 'event', 0, '', a }
end

-- GiveBack E a
function OPS.GiveBack(e, a)
  local k = read_bucket()
  if k == nil then return { 'corrupt' } end
  give_back(k, e, num(a), gift(e, num(a)))
  save(k)
  return { 'ok' }
end

-- Each operation's arguments (ARGV[3..]): an id (CONTRACT.md section 1's
-- characters), a count (canonical), a dimension (a short reason), a flag
-- (0 or 1), "m:b:s" items or "j:a:b:s" credits joined by ";" (or empty).
local SIGNATURES = {
  Start = { 'id', 'id', 'n', 'n', 'n' },
  Peek = { 'id' },
  Reject = { 'id', 'n', 'n', 'n', 'dim', 'flag', 'items3' },
  Give = { 'id', 'n', 'n', 'n', 'n' },
  Accept = { 'id', 'id', 'n', 'n', 'n', 'items3' },
  Yield = { 'id', 'n' },
  ReturnAll = { 'id', 'n' },
  Reserve = { 'id', 'id' },
  Settle = { 'id' },
  Undo = { 'id' },
  Unreserve = { 'id' },
  Cleanup = { 'id', 'items4' },
  RefundLook = { 'id', 'id' },
  Notify = { 'n', 'n', 'n' },
  RefundRevert = { 'id', 'id' },
  ReleaseLook = { 'id' },
  ReleaseRevert = { 'id' },
  Memo = { 'id' },
  TransferMark = { 'id' },
  TransferTake = { 'id', 'n', 'n', 'n' },
  TransferCredit = { 'id', 'n', 'n', 'n' },
  TransferSettle = { 'id', 'n', 'n' },
  AdjustMark = { 'id' },
  AdjustCredit = { 'id', 'n', 'n' },
  AdjustRemove = { 'id', 'n', 'n' },
  OpenGifts = {},
  EventState = { 'id' },
  GiveBack = { 'id', 'n' },
}

local function items(v, width)
  if v == '' then return true end
  for _, item in ipairs(split(v, ';')) do
    local p = split(item, ':')
    if #p ~= width then return false end
    for _, x in ipairs(p) do
      if not canonical(x) then return false end
    end
  end
  return true
end

local function check_args(sig)
  if #ARGV ~= #sig + 2 then
    fail('BADARG ' .. op .. ' takes ' .. #sig .. ' arguments after the ttl, got ' .. (#ARGV - 2))
  end
  for i, kind in ipairs(sig) do
    local v = ARGV[i + 2]
    local ok
    if kind == 'id' then
      ok = event_id(v)
    elseif kind == 'n' then
      ok = canonical(v)
    elseif kind == 'dim' then
      ok = v == 'budget_exceeded' or v == 'stock_insufficient'
    elseif kind == 'flag' then
      ok = v == '0' or v == '1'
    elseif kind == 'items3' then
      ok = items(v, 3)
    else
      ok = items(v, 4)
    end
    if not ok then fail('BADARG ' .. op .. ' argument ' .. i .. ' (' .. kind .. '): ' .. show(v)) end
  end
end

-- The slot's stability. This script reads and writes keys of its slot beyond
-- KEYS[1], which a Redis Cluster node checks only as each is touched: while the
-- slot is being migrated, the source refuses a key that is not there (moved
-- already, or new) half-way through the call ("ERR Script attempted to access a
-- non local key in a cluster node"), after the call's earlier writes. So every
-- call first asks for two keys nobody writes, in one EXISTS: a node answers 0
-- when the slot is stable (and a standalone server always), and refuses it on
-- the source of a migration (ASK) and on its target (TRYAGAIN, under ASKING).
-- The call then replies TRYAGAIN, retried, before it has read or written
-- anything (found by the chaos suite's Cluster gate run, a node added and
-- slots moved onto it while events flowed).
local function stable_slot()
  local r = redis.pcall('EXISTS', B .. ':probe:a', B .. ':probe:b')
  if type(r) == 'table' and r.err then
    local e = r.err
    -- An ACL without EXISTS is the operator's to fix (Redis 7.0 says "can't run
    -- this command", later versions and Valkey "ACL failure"): refused as such.
    if string.find(e, 'NOPERM', 1, true) or string.find(e, 'ACL failure', 1, true)
        or string.find(e, "can't run this command", 1, true) then
      fail('NOPERM ' .. B .. ': ' .. e)
    end
    if string.find(e, 'cluster is down', 1, true) then fail('CLUSTERDOWN ' .. B .. ': ' .. e) end
    fail('TRYAGAIN ' .. B .. ' is in a slot being migrated: ' .. e)
  end
end

local function main()
  if #KEYS ~= 1 then fail('BADARG expected 1 key, got ' .. #KEYS) end
  stable_slot()
  local f, sig = OPS[op], SIGNATURES[op]
  if f == nil or sig == nil then fail('BADARG unknown operation: ' .. show(op)) end
  if not canonical(ttl) or ttl == '0' then fail('BADARG ttl: ' .. show(ttl)) end
  check_args(sig)
  return f(unpack(ARGV, 3))
end

return run(main)
