local removed = redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[2] == 'refund' then return {removed, now} end
local fence = tonumber(ARGV[3])
raise_fence(KEYS[2], ARGV[1], now + fence)
if ARGV[4] == '1' then key_charge(1, ARGV[1], 5, fence) end
return {removed, now}
