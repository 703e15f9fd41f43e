local refused = key_check(1, 3)
if refused then return {refused[1], refused[2], now} end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
extend(KEYS[1], ttl)
return {'granted', 0, now}
