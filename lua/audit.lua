-- audit.lua: everything `deductor audit` judges of one promotion, read at one instant
-- (a script runs alone), so a sale in progress never shows a passing difference
-- between the promotion hash and its records. Reads only; values are returned raw:
-- the caller parses them as strictly as lib.lua does (corrupt is corrupt).
--
-- KEYS[1] promotion  promo:{P}   hash
--
-- ARGV[1] mode     "slot": list P's keys here with CLUSTER GETKEYSINSLOT (Redis Cluster:
--                  every key of P is in slot {P}, so on this node; cost in proportion
--                  to that slot, never to the keyspace). While this node is migrating
--                  or importing the slot (a reshard), its keys are split between two
--                  nodes and a count here would show a false breach: the reply is then
--                  the error "TRYAGAIN slot <n> is being migrated ..." and nothing was
--                  read (CLUSTER NODES, this node's own line);
--                  "scan": list them here with SCAN MATCH, only when the database holds
--                  at most ARGV[3] keys (a standalone server; else the reply is
--                  {"too_big", DBSIZE} and nothing was read);
--                  "keys": read the keys the caller listed, ARGV[4..];
--                  "index": a standalone server: when the promotion hash has `indexed`
--                  (the unix day its incarnation was created; `promo set` writes it on a
--                  standalone server, where deduct.lua indexes every record it creates),
--                  list the records named by its day indexes promo:{P}:index:<D>, D from
--                  indexed - 1 (at most ARGV[3] - 3653 days back: the longest record TTL)
--                  to ARGV[3] + 1 (cost in proportion to the promotion, never to the
--                  keyspace); without it the reply is {"unindexed"} and nothing was read
-- ARGV[2] prefix   "promo:{P}:" (the promotion key followed by ':'): P's other keys
-- ARGV[3] limit    mode "scan": the largest DBSIZE scanned inside the script; mode "index":
--                  today, the caller's unix seconds / 86400
-- ARGV[4..]        mode "keys": keys of P
--
-- Reply: {"ok", promotion, records, counters, indexes}
--   promotion  {type, fields...}: type "hash" with the fields of FIELDS it holds as flat
--              pairs (HMGET), "none" when absent, or another TYPE (corrupt)
--   records    {key, type, values...} for each promo:{P}:order:O listed: "string" and its
--              value (the lean layout of lib.lua), or "hash" and the fields of FIELDS it
--              holds (the previous layout), or another type (corrupt)
--   counters   {key, type, value} for each promo:{P}:used:C listed, and for the
--              counter of every customer a listed record names (read at the same instant)
--   indexes    mode "index": {key, type} of each day index that is not a set (corrupt)

local k_promo, mode, prefix = KEYS[1], ARGV[1], ARGV[2]

-- The fields lib.lua's read_promotion / read_record look at (others, such as a
-- record's refund:<E> results, are ignored as the scripts ignore them).
local FIELDS = { 'state', 'event', 'customer', 'gen', 'absorbed', 'budget', 'stock', 'budget0',
  'stock0', 'counted', 'per_customer', 'status', 'starts_at', 'ends_at', 'initial_budget',
  'initial_stock', 'indexed' }

-- {type, values...}: "hash" and its known fields as flat pairs, "string" and its value,
-- "none", or another type (corrupt). No TYPE call unless the read fails.
local function read(key, as_hash)
  local r = redis.pcall(as_hash and 'HMGET' or 'GET', key, unpack(as_hash and FIELDS or {}))
  if type(r) == 'table' and r.err then
    local t = redis.call('TYPE', key).ok
    if t == 'hash' then return read(key, true) end
    if t == 'string' then return { t, redis.call('GET', key) } end
    return { t }
  end
  if not as_hash then
    if r == false then return { 'none' } end
    return { 'string', r }
  end
  local out, any = { 'hash' }, false
  for i, f in ipairs(FIELDS) do
    if r[i] then
      out[#out + 1] = f
      out[#out + 1] = r[i]
      any = true
    end
  end
  if not any and redis.call('EXISTS', key) == 0 then return { 'none' } end
  return out
end

local keys, bad_indexes = {}, {}
if mode == 'index' then
  -- A promotion that is not a hash (corrupt) is unindexed: the other modes report it.
  local from = redis.pcall('HGET', k_promo, 'indexed')
  local today = tonumber(ARGV[3])
  if type(from) ~= 'string' or #from > 15 or not string.find(from, '^[0-9]+$') or not today then
    return { 'unindexed' }
  end
  -- Days before the incarnation's own hold none of its records (one day of clock
  -- difference between the pods and the operator allowed).
  local first = math.max(tonumber(from) - 1, today - 3653)
  local listed = {}
  for d = first, today + 1 do
    local k = prefix .. 'index:' .. string.format('%d', d)
    local r = redis.pcall('SMEMBERS', k)
    if type(r) == 'table' and r.err then
      bad_indexes[#bad_indexes + 1] = { k, redis.call('TYPE', k).ok }
    else
      for _, o in ipairs(r) do
        if not listed[o] then
          listed[o] = true
          keys[#keys + 1] = prefix .. 'order:' .. o
        end
      end
    end
  end
elseif mode == 'slot' then
  local slot = redis.call('CLUSTER', 'KEYSLOT', k_promo)
  for line in string.gmatch(redis.call('CLUSTER', 'NODES'), '[^\n]+') do
    if string.find(line, 'myself', 1, true) and (string.find(line, '[' .. slot .. '->-', 1, true)
        or string.find(line, '[' .. slot .. '-<-', 1, true)) then
      return redis.error_reply('TRYAGAIN slot ' .. slot .. ' is being migrated (a reshard): audit '
        .. 'it again when the migration has ended')
    end
  end
  local n = redis.call('CLUSTER', 'COUNTKEYSINSLOT', slot)
  if n > 0 then keys = redis.call('CLUSTER', 'GETKEYSINSLOT', slot, n) end
elseif mode == 'scan' then
  local size = redis.call('DBSIZE')
  if size > tonumber(ARGV[3]) then return { 'too_big', size } end
  -- The prefix holds no glob character (redis.key_prefix refuses them; ids are
  -- [A-Za-z0-9_.-]), so it is its own pattern.
  local cursor = '0'
  repeat
    local r = redis.call('SCAN', cursor, 'MATCH', prefix .. '*', 'COUNT', 1000)
    cursor = r[1]
    for _, k in ipairs(r[2]) do keys[#keys + 1] = k end
  until cursor == '0'
else
  for i = 4, #ARGV do keys[#keys + 1] = ARGV[i] end
end

local order_prefix, used_prefix = prefix .. 'order:', prefix .. 'used:'
local records, counters, seen = {}, {}, {}
local function counter(key)
  if seen[key] then return end
  seen[key] = true
  local r = read(key, false)
  counters[#counters + 1] = { key, r[1], r[2] }
end
for _, k in ipairs(keys) do
  if string.sub(k, 1, #order_prefix) == order_prefix then
    local r = read(k, true)
    table.insert(r, 1, k)
    records[#records + 1] = r
    if r[2] == 'hash' then
      for i = 3, #r - 1, 2 do
        if r[i] == 'customer' then counter(used_prefix .. r[i + 1]) end
      end
    elseif r[2] == 'string' then
      -- The lean layout's 7th field is the customer (empty: none).
      local c = string.match(r[3], '^' .. string.rep('[^|]*|', 6) .. '([^|]+)')
      if c then counter(used_prefix .. c) end
    end
  elseif string.sub(k, 1, #used_prefix) == used_prefix then
    counter(k)
  end
end
return { 'ok', read(k_promo, true), records, counters, bad_indexes }
