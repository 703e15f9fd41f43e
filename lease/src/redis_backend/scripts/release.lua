local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
local removed = 0
if score then
  redis.call('ZREM', KEYS[1], ARGV[1])
  if tonumber(score) >= now then removed = 1 end
  redis.call('HDEL', KEYS[3], ARGV[1])
end
raise_fence(KEYS[4], ARGV[1], now + tonumber(ARGV[4]))
local spend = tonumber(ARGV[2])
if spend > 0 then add_spend(KEYS[2], spend, tonumber(ARGV[3])) end
if #KEYS > 4 then
  redis.call('ZREM', KEYS[5], ARGV[1])
  raise_fence(KEYS[6], ARGV[1], now + tonumber(ARGV[4]))
  if ARGV[5] == '1' then key_charge(5, ARGV[1], 6, tonumber(ARGV[4])) end
end
return {removed, now}
