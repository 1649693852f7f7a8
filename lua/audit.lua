-- audit.lua: everything `deductor audit` judges of one promotion, read at one instant
-- (a script runs alone), so a sale in progress never shows a passing difference
-- between the promotion hash and its records. Reads only; values are returned raw:
-- the caller parses them as strictly as lib.lua does (corrupt is corrupt).
--
-- KEYS[1] promotion  promo:{P}   hash
--
-- ARGV[1] mode     "slot": list P's keys here with CLUSTER GETKEYSINSLOT (Redis Cluster:
--                  every key of P is in slot {P}, so on this node; cost in proportion
--                  to that slot, never to the keyspace);
--                  "scan": list them here with SCAN MATCH, only when the database holds
--                  at most ARGV[3] keys (a standalone server; else the reply is
--                  {"too_big", DBSIZE} and nothing was read);
--                  "keys": read the keys the caller listed, ARGV[4..]
-- ARGV[2] prefix   "promo:{P}:" (the promotion key followed by ':'): P's other keys
-- ARGV[3] limit    mode "scan": the largest DBSIZE scanned inside the script
-- ARGV[4..]        mode "keys": keys of P
--
-- Reply: {"ok", promotion, records, counters}
--   promotion  {type, fields...}: type "hash" with its flat HGETALL, "none" when absent,
--              or another TYPE (corrupt)
--   records    {key, type, fields...} for each promo:{P}:order:O listed
--   counters   {key, type, value} for each promo:{P}:used:C listed, and for the
--              counter of every customer a listed record names (read at the same instant)

local k_promo, mode, prefix = KEYS[1], ARGV[1], ARGV[2]

local function read(key)
  local t = redis.call('TYPE', key).ok
  if t == 'hash' then
    local out = { t }
    for _, v in ipairs(redis.call('HGETALL', key)) do out[#out + 1] = v end
    return out
  elseif t == 'string' then
    return { t, redis.call('GET', key) }
  end
  return { t }
end

local keys = {}
if mode == 'slot' then
  local slot = redis.call('CLUSTER', 'KEYSLOT', k_promo)
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
  local r = read(key)
  counters[#counters + 1] = { key, r[1], r[2] }
end
for _, k in ipairs(keys) do
  if string.sub(k, 1, #order_prefix) == order_prefix then
    local r = read(k)
    table.insert(r, 1, k)
    records[#records + 1] = r
    if r[2] == 'hash' then
      for i = 3, #r - 1, 2 do
        if r[i] == 'customer' then counter(used_prefix .. r[i + 1]) end
      end
    end
  elseif string.sub(k, 1, #used_prefix) == used_prefix then
    counter(k)
  end
end
return { 'ok', read(k_promo), records, counters }
