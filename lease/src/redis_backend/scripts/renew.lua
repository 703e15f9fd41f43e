local ttl = tonumber(ARGV[2])
if live(KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  extend(KEYS[1], ttl)
  redis.call('ZREM', KEYS[2], ARGV[1])
  return {1, now}
end
if fenced(KEYS[2], ARGV[1]) then return {3, now} end
if ARGV[3] ~= '1' then return {5, now} end
local limit = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
if limit > 0 and redis.call('ZCOUNT', KEYS[1], now, '+inf') >= limit then return {4, now} end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
extend(KEYS[1], ttl)
return {2, now}
