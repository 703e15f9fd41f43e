local kept = redis.call('GET', KEYS[6])
local recount = tonumber(ARGV[11])
if not kept then
  if recount > 0 then
    redis.call('SET', KEYS[6], now + recount, 'PX', KEPT_MS)
    return {'wiped', recount, now}
  end
  redis.call('SET', KEYS[6], 0, 'PX', KEPT_MS)
elseif tonumber(kept) > now then
  return {'recounting', tonumber(kept) - now, now}
else
  extend(KEYS[6], KEPT_MS / 2)
end
local user_limit = tonumber(ARGV[9])
if user_limit > 0 then
  local user_retry = rpm_full(KEYS[5], user_limit, tonumber(ARGV[6]))
  if user_retry then return {'user_rpm', user_retry, now} end
end
local keyed = ARGV[10] == '1'
if keyed then
  local refused = key_check(7, 12)
  if refused then return {refused[1], refused[2], now} end
end
if ARGV[8] ~= '1' then
  local cool = redis.call('PTTL', KEYS[3])
  if cool ~= -2 then return {'cooling', math.max(cool, 0), now} end
end
local ttl = tonumber(ARGV[2])
local concurrency = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
if concurrency > 0 and redis.call('ZCARD', KEYS[1]) >= concurrency then
  return {'concurrency', 0, now}
end
local rpm = tonumber(ARGV[4])
local rpm_window = tonumber(ARGV[6])
local retry = rpm_full(KEYS[2], rpm, rpm_window)
if retry then return {'rpm', retry, now} end
local window_limit = tonumber(ARGV[5])
if window_limit > 0 then
  local w = redis.call('HMGET', KEYS[4], 'start', 'spend')
  local start = tonumber(w[1])
  local window = tonumber(ARGV[7])
  if start and now < start + window and tonumber(w[2] or '0') >= window_limit then
    return {'session_window', start + window - now, now}
  end
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
extend(KEYS[1], ttl)
if keyed then
  redis.call('ZADD', KEYS[7], now + ttl, ARGV[1])
  extend(KEYS[7], ttl)
end
if rpm > 0 then
  redis.call('ZADD', KEYS[2], now, ARGV[1])
  extend(KEYS[2], rpm_window)
end
if user_limit > 0 then
  redis.call('ZADD', KEYS[5], now, ARGV[1])
  extend(KEYS[5], rpm_window)
end
return {'granted', 0, now}
