-- How long an account's `kept` marker lives after its last acquire or renewal (between half and all
-- of it: `extend` renews it when half is left).
local KEPT_MS = 86400000
local function extend(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, 2 * ms) end
end
local function rpm_full(key, limit, window)
  if limit <= 0 then return nil end
  local since = now - window
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. since)
  if redis.call('ZCARD', key) < limit then return nil end
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  local retry = 1
  if oldest[2] then retry = math.max(1, tonumber(oldest[2]) + window - now) end
  return retry
end
local function add_spend(key, micros, window)
  local w = redis.call('HMGET', key, 'start', 'spend')
  local start = tonumber(w[1])
  if (not start) or now >= start + window then
    redis.call('HSET', key, 'start', now, 'spend', micros)
    redis.call('PEXPIRE', key, window)
    return micros
  end
  return redis.call('HINCRBY', key, 'spend', micros)
end
