return {redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES'), redis.call('HGETALL', KEYS[2]), now}
