#!lua flags=allow-oom
-- Renew a lease the caller still holds.
-- KEYS[1] lease hash, KEYS[2] cancel intent
-- ARGV[1] owner token, ARGV[2] fence, ARGV[3] lease ttl ms
-- Guarantees: renews only while both owner and fence match, so a worker that was paused
-- and replaced can never extend the new owner's lease. Reports a durable cancel intent in
-- the same round trip, so cancellation reaches the holder with no extra command.
-- Returns {expires_at_ms or 0 when the lease is lost, cancel_requested 0|1}
-- allow-oom: at maxmemory a running Action keeps its lease (it rewrites one field).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cancel = redis.call('EXISTS', KEYS[2])
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1]
   or redis.call('HGET', KEYS[1], 'fence') ~= ARGV[2] then
  return {0, cancel}
end
local until_ms = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'expires_at_ms', until_ms)
return {until_ms, cancel}
