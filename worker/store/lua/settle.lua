#!lua flags=allow-oom
-- Write an Action's terminal result and the terminal chunk that closes its chunk stream,
-- once, under the lease fence.
-- KEYS[1] lease hash, KEYS[2] result, KEYS[3] terminal chunk, KEYS[4] owed chunks
-- ARGV[1] owner token, ARGV[2] fence, ARGV[3] result JSON, ARGV[4] result ttl ms,
-- ARGV[5] terminal chunk JSON ('' for none: a non-streaming capability has no chunk
-- stream, as upstream), ARGV[6] owed chunks ('' for none: the chunks the bus refused
-- while the Action ran, newline-separated JSON, oldest first), ARGV[7] '1' for a refusal
-- that nothing was attempted for (recorded as `refused` in the lease: another request may
-- still take the id, see lease_acquire.lua)
-- Guarantees: only the current owner at the current fence can write; the result and its
-- terminal chunk are written together and write-once (existing ones are returned, never
-- replaced), so a republish of the result always has the chunk its last_chunk_sha256
-- names; the lease is released in the same step. Re-running after a lost reply returns
-- 'exists' with the caller's own result and chunk.
-- The owed chunks are written with them, so a republish after a bus outage sends the
-- chunks before the terminal one and the hash chain has no gap.
-- Returns {status, stored_result, stored_terminal, stored_owed}: 'settled' | 'exists' |
-- 'fenced_out' (stored_terminal is '' for a result without a chunk stream; stored_owed is
-- '' when no chunk was owed).
-- allow-oom: at Redis maxmemory (noeviction) the settle of finished work must still be
-- written; new leases stop earlier, at the worker's memory reserve (StoreHealth).
local existing = redis.call('GET', KEYS[2])
if existing then
  return {'exists', existing, redis.call('GET', KEYS[3]) or '', redis.call('GET', KEYS[4]) or ''}
end
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1]
   or redis.call('HGET', KEYS[1], 'fence') ~= ARGV[2] then
  return {'fenced_out', '', '', ''}
end
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
if ARGV[5] ~= '' then
  redis.call('SET', KEYS[3], ARGV[5], 'PX', ARGV[4])
end
if ARGV[6] ~= '' then
  redis.call('SET', KEYS[4], ARGV[6], 'PX', ARGV[4])
end
redis.call('HSET', KEYS[1], 'owner', '', 'expires_at_ms', 0)
if ARGV[7] == '1' then
  redis.call('HSET', KEYS[1], 'refused', '1')
end
return {'settled', ARGV[3], ARGV[5], ARGV[6]}
