return {add_spend(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2])), now}
