local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
local ends = now + tonumber(ARGV[2])
if score then
  ends = math.min(tonumber(score), ends)
  redis.call('ZADD', KEYS[1], 'XX', ends, ARGV[1])
end
raise_fence(KEYS[2], ARGV[1], ends + tonumber(ARGV[3]))
return {0, now}
