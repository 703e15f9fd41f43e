if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return {1, 0, now} end
local limit = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local retry = rpm_full(KEYS[1], limit, window)
if retry then return {0, retry, now} end
redis.call('ZADD', KEYS[1], now, ARGV[1])
extend(KEYS[1], window)
return {1, 0, now}
