local seed = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local current = redis.call('GET', KEYS[1])
if current and tonumber(current) >= seed then return {0, now} end
if current then
  redis.call('SET', KEYS[1], ARGV[1], 'KEEPTTL')
elseif ttl > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
else
  redis.call('SET', KEYS[1], ARGV[1])
end
return {1, now}
