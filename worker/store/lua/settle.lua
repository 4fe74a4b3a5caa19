#!lua flags=allow-oom
-- Write an Action's terminal result, once, under the lease fence.
-- KEYS[1] lease hash, KEYS[2] result
-- ARGV[1] owner token, ARGV[2] fence, ARGV[3] result JSON, ARGV[4] result ttl ms
-- Guarantees: only the current owner at the current fence can write; the result is
-- write-once (an existing one is returned, never replaced); the lease is released in the
-- same step. Re-running after a lost reply returns 'exists' with the caller's own result.
-- Returns {status, stored_result}: 'settled' | 'exists' | 'fenced_out'
-- allow-oom: at Redis maxmemory (noeviction) the settle of finished work must still be
-- written; new leases stop earlier, at the worker's memory reserve (StoreHealth).
local existing = redis.call('GET', KEYS[2])
if existing then
  return {'exists', existing}
end
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1]
   or redis.call('HGET', KEYS[1], 'fence') ~= ARGV[2] then
  return {'fenced_out', ''}
end
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
redis.call('HSET', KEYS[1], 'owner', '', 'expires_at_ms', 0)
return {'settled', ARGV[3]}
