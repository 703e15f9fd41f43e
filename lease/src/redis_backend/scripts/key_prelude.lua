local function tpm_full(key, limit, window)
  local h = redis.call('HGETALL', key)
  local since = math.floor((now - window) / 1000)
  local buckets, stale, sum = {}, {}, 0
  for i = 1, #h, 2 do
    local s = tonumber(h[i])
    if s <= since then
      stale[#stale + 1] = h[i]
    else
      local n = tonumber(h[i + 1])
      buckets[#buckets + 1] = {s, n}
      sum = sum + n
    end
  end
  if #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
  if sum < limit then return nil end
  table.sort(buckets, function(x, y) return x[1] < y[1] end)
  for _, b in ipairs(buckets) do
    sum = sum - b[2]
    if sum < limit then return math.max(1, b[1] * 1000 + window - now) end
  end
  return window
end
local function key_check(k, a)
  for j = 0, 3 do
    local limit = tonumber(ARGV[a + 3 + 2 * j])
    if limit > 0 and tonumber(redis.call('GET', KEYS[k + 4 + j]) or '0') >= limit then
      return {'key_budget', tonumber(ARGV[a + 4 + 2 * j])}
    end
  end
  local tpm = tonumber(ARGV[a + 1])
  if tpm > 0 then
    local retry = tpm_full(KEYS[k + 2], tpm, tonumber(ARGV[a + 2]))
    if retry then return {'key_tpm', retry} end
  end
  local concurrency = tonumber(ARGV[a])
  redis.call('ZREMRANGEBYSCORE', KEYS[k], '-inf', '(' .. now)
  if concurrency > 0 and redis.call('ZCARD', KEYS[k]) >= concurrency then
    return {'key_concurrency', 0}
  end
  return nil
end
local function key_charge(k, id, a, billed_ms)
  redis.call('ZREMRANGEBYSCORE', KEYS[k + 3], '-inf', '(' .. now)
  if redis.call('ZSCORE', KEYS[k + 3], id) then return end
  redis.call('ZADD', KEYS[k + 3], now + billed_ms, id)
  extend(KEYS[k + 3], billed_ms)
  local tokens = tonumber(ARGV[a])
  local window = tonumber(ARGV[a + 2])
  if tokens > 0 then
    redis.call('HINCRBY', KEYS[k + 2], math.floor(now / 1000), tokens)
    extend(KEYS[k + 2], window + 1000)
  end
  local spend = tonumber(ARGV[a + 1])
  if spend > 0 then
    for j = 0, 3 do
      redis.call('INCRBY', KEYS[k + 4 + j], spend)
      local ttl = tonumber(ARGV[a + 3 + j])
      if ttl > 0 then extend(KEYS[k + 4 + j], ttl) end
    end
  end
end
