local holder = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if holder ~= tonumber(ARGV[3]) then return {0, now} end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not (score and tonumber(score) >= now) then return {0, now} end
local ends = math.min(tonumber(score), now + tonumber(ARGV[2]))
redis.call('ZADD', KEYS[1], 'XX', ends, ARGV[1])
raise_fence(KEYS[3], ARGV[1], ends + tonumber(ARGV[4]))
if #KEYS > 3 then
  local key_score = redis.call('ZSCORE', KEYS[4], ARGV[1])
  if key_score then redis.call('ZADD', KEYS[4], 'XX', math.min(tonumber(key_score), ends), ARGV[1]) end
  raise_fence(KEYS[5], ARGV[1], ends + tonumber(ARGV[4]))
end
return {1, now}
