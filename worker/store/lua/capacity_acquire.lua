-- Take or refresh one slot of an endpoint's run semaphore (docs/architecture.md §8 "Endpoint capacity").
-- KEYS[1] the endpoint's capacity sorted set (member: source Action id, score: expiry ms)
-- ARGV[1] holder (the source Action id of the run), ARGV[2] limit, ARGV[3] slot ttl ms,
-- ARGV[4] '1' to add even when full (the run already exists; the count must say so)
-- Guarantees: at most `limit` unexpired holders unless forced; a holder counts once however
-- many deliveries of its Action ask (so duplicates never take two slots); an abandoned slot
-- frees itself at its expiry. Time is Redis TIME. Re-running it refreshes the same slot.
-- Returns {1 acquired | 0 full, holders after the call, now_ms}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local until_ms = now + tonumber(ARGV[3])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) or ARGV[4] == '1'
   or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], until_ms, ARGV[1])
  return {1, redis.call('ZCARD', KEYS[1]), now}
end
return {0, redis.call('ZCARD', KEYS[1]), now}
