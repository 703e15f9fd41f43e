local ttl = tonumber(ARGV[2])
local keyed = #KEYS > 2
if live(KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  extend(KEYS[1], ttl)
  redis.call('ZREM', KEYS[2], ARGV[1])
  if keyed then
    redis.call('ZADD', KEYS[3], now + ttl, ARGV[1])
    extend(KEYS[3], ttl)
    redis.call('ZREM', KEYS[4], ARGV[1])
  end
  return {1, now}
end
if fenced(KEYS[2], ARGV[1]) then return {3, now} end
if keyed and fenced(KEYS[4], ARGV[1]) then return {3, now} end
if ARGV[3] ~= '1' then return {5, now} end
local limit = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
if limit > 0 and redis.call('ZCOUNT', KEYS[1], now, '+inf') >= limit then return {4, now} end
if keyed then
  local key_limit = tonumber(ARGV[5])
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. now)
  if key_limit > 0 and not live(KEYS[3], ARGV[1])
    and redis.call('ZCOUNT', KEYS[3], now, '+inf') >= key_limit then return {4, now} end
  redis.call('ZADD', KEYS[3], now + ttl, ARGV[1])
  extend(KEYS[3], ttl)
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
extend(KEYS[1], ttl)
return {2, now}
