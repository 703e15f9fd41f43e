if not live(KEYS[1], ARGV[1]) then
  if fenced(KEYS[3], ARGV[1]) then return {-1, now} end
  return {0, now}
end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
extend(KEYS[1], ttl)
redis.call('ZREM', KEYS[3], ARGV[1])
if #KEYS > 3 then
  redis.call('ZADD', KEYS[4], now + ttl, ARGV[1])
  extend(KEYS[4], ttl)
  redis.call('ZREM', KEYS[5], ARGV[1])
end
local epoch = redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
extend(KEYS[2], ttl)
return {epoch, now}
