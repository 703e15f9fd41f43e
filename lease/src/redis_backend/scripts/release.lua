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
if removed == 1 and redis.call('ZCARD', KEYS[5]) > 0
    and redis.call('ZCOUNT', KEYS[5], now, '+inf') > 0 then
  -- The channel is the last argument (`redis_keys::LEASE_WAKE_CHANNEL`: key names are spelled
  -- in one place). pcall: a publish refused (an ACL without the channel) must not fail the
  -- release; waiters then poll.
  redis.pcall('PUBLISH', ARGV[#ARGV], ARGV[5] .. ' ' .. ARGV[1])
end
if #KEYS > 5 then
  redis.call('ZREM', KEYS[6], ARGV[1])
  raise_fence(KEYS[7], ARGV[1], now + tonumber(ARGV[4]))
  if ARGV[6] == '1' then key_charge(6, ARGV[1], 7, tonumber(ARGV[4])) end
end
return {removed, now}
