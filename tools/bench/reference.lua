-- reference.lua: issue 14's reference, the four-key deduct script of the
-- original design article, rewritten from its description for the bench's
-- ceiling comparison. It is NOT deductor's script and is never run by the
-- service: no validation, no records, no memos, no refunds.
--
-- KEYS[1] budget:{P}            string int: budget left
-- KEYS[2] stock:{P}             string int: stock left
-- KEYS[3] userLimit:{P}:{C}     string int: orders of customer C
-- KEYS[4] idempotency key       set once per event
--
-- ARGV[1] amount      budget to deduct
-- ARGV[2] quantity    stock to deduct
-- ARGV[3] limit       orders per customer
-- ARGV[4] ttl_secs    TTL of the idempotency key
--
-- Reply: 1 deducted, 0 duplicate, -1 budget, -2 stock, -3 customer limit.

if not redis.call('SET', KEYS[4], '1', 'NX', 'EX', ARGV[4]) then
  return 0
end
if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then
  return -1
end
if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[2]) then
  return -2
end
if tonumber(redis.call('GET', KEYS[3]) or '0') >= tonumber(ARGV[3]) then
  return -3
end
redis.call('DECRBY', KEYS[1], ARGV[1])
redis.call('DECRBY', KEYS[2], ARGV[2])
redis.call('INCR', KEYS[3])
return 1
