#!lua flags=allow-oom
-- Give a lease back without settling (graceful shutdown, or a nak'd delivery).
-- KEYS[1] lease hash; ARGV[1] owner token, ARGV[2] fence
-- Guarantees: only the current owner at the current fence can release; the fence is kept,
-- so the next owner's fence is still higher than this one.
-- Returns 1 when released, 0 when the caller no longer held it.
-- allow-oom: at maxmemory a shutdown can still hand its leases back.
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1]
   or redis.call('HGET', KEYS[1], 'fence') ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], 'owner', '', 'expires_at_ms', 0)
return 1
