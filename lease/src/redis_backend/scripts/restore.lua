local n = tonumber(ARGV[1])
local i = 2
local longest = 0
for _ = 1, n do
  local ttl = tonumber(ARGV[i + 1])
  redis.call('ZADD', KEYS[1], 'GT', now + ttl, ARGV[i])
  longest = math.max(longest, ttl)
  i = i + 2
end
if longest > 0 then extend(KEYS[1], longest) end
local events = 0
while i < #ARGV do
  redis.call('ZADD', KEYS[2], now - tonumber(ARGV[i + 1]), ARGV[i])
  events = events + 1
  i = i + 2
end
if events > 0 then extend(KEYS[2], 60000) end
return {n, now}
