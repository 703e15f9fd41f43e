local ttl = tonumber(ARGV[2])
local set
if ttl > 0 then
  set = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ttl)
else
  set = redis.call('SET', KEYS[1], ARGV[1], 'NX')
end
if set then return {1, now} end
return {0, now}
