redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
local present = redis.call('ZSCORE', KEYS[1], ARGV[1]) and 1 or 0
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
extend(KEYS[1], tonumber(ARGV[2]))
local kept = tonumber(ARGV[4])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3] .. '|' .. now)
local reports = redis.call('HGETALL', KEYS[2])
for i = 1, #reports - 1, 2 do
  local at = tonumber(string.match(reports[i + 1], '|(%d+)$'))
  if (not at) or at + kept < now then redis.call('HDEL', KEYS[2], reports[i]) end
end
redis.call('PEXPIRE', KEYS[2], kept)
return {redis.call('ZRANGE', KEYS[1], 0, -1), present, now}
