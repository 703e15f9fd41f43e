redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
local ttl = tonumber(ARGV[3])
local present = redis.call('ZSCORE', KEYS[1], ARGV[1])
local count = redis.call('ZCARD', KEYS[1])
if (not present) and count >= tonumber(ARGV[2]) then return {0, now} end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
extend(KEYS[1], ttl)
if present then return {count, now} end
return {count + 1, now}
