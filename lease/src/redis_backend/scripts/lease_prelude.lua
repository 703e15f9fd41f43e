local function live(key, id)
  local score = redis.call('ZSCORE', key, id)
  return score and tonumber(score) >= now
end
local function fenced(key, id)
  local fence = redis.call('ZSCORE', key, id)
  return fence and tonumber(fence) >= now
end
local function raise_fence(key, id, expires)
  if now % 8 == 0 then redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. now) end
  redis.call('ZADD', key, 'GT', expires, id)
  extend(key, expires - now)
end
