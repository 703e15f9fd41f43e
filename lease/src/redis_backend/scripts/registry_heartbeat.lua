redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
extend(KEYS[1], tonumber(ARGV[2]))
return {redis.call('ZRANGE', KEYS[1], 0, -1), now}
