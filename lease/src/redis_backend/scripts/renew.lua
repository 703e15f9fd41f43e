local ttl = tonumber(ARGV[2])
local keyed = #KEYS > 3
local mode = ARGV[3]
if live(KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  extend(KEYS[1], ttl)
  redis.call('ZREM', KEYS[2], ARGV[1])
  if keyed then
    redis.call('ZADD', KEYS[4], now + ttl, ARGV[1])
    extend(KEYS[4], ttl)
    redis.call('ZREM', KEYS[5], ARGV[1])
  end
  if ARGV[6] == '1' then
    -- One read: -2 is a missing marker (a lease granted by an older release), set as kept.
    local left = redis.call('PTTL', KEYS[3])
    if left == -2 then redis.call('SET', KEYS[3], 0, 'PX', KEPT_MS)
    elseif left < KEPT_MS / 2 then redis.call('PEXPIRE', KEYS[3], KEPT_MS) end
  end
  return {1, now}
end
if fenced(KEYS[2], ARGV[1]) then return {3, now} end
if keyed and fenced(KEYS[5], ARGV[1]) then return {3, now} end
if mode == '0' then return {5, now} end
-- The lease is gone. With its account's marker gone too, Redis lost the account's state: new
-- acquires wait `recount` ms while the holders put their leases back, whatever the limit (they
-- were within it before the loss); in that time every restore is one of those.
local state = 2
if ARGV[6] == '1' then
  local kept = redis.call('GET', KEYS[3])
  local recount = tonumber(ARGV[7])
  if not kept and recount > 0 then
    redis.call('SET', KEYS[3], now + recount, 'PX', KEPT_MS)
    state = 6
  elseif kept and tonumber(kept) > now then
    state = 7
  end
end
if state == 2 then
  if mode == '2' then return {8, now} end
  local limit = tonumber(ARGV[4])
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
  if limit > 0 and redis.call('ZCOUNT', KEYS[1], now, '+inf') >= limit then return {4, now} end
end
if keyed then
  -- The key's room always: its other leases run on other accounts, which do not recount.
  local key_limit = tonumber(ARGV[5])
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. now)
  if key_limit > 0 and not live(KEYS[4], ARGV[1])
    and redis.call('ZCOUNT', KEYS[4], now, '+inf') >= key_limit then return {4, now} end
  redis.call('ZADD', KEYS[4], now + ttl, ARGV[1])
  extend(KEYS[4], ttl)
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
extend(KEYS[1], ttl)
return {state, now}
