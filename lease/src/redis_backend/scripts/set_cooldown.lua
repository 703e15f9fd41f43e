local ttl = tonumber(ARGV[1])
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('SET', KEYS[1], 'hard', 'PX', ttl) end
return {0, now}
