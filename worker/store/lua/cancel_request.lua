-- Persist a cancel intent for an Action (before, during or after its execution).
-- KEYS[1] cancel intent, KEYS[2] result, KEYS[3] lease hash
-- ARGV[1] intent JSON, ARGV[2] key ttl ms
-- Guarantees: the intent is durable before the reply says `accepted`; an Action that is
-- already settled is not marked (its result stands); the first intent is kept.
-- Returns {state, owner}: 'settled' | 'recorded' | 'already_requested'; owner is the
-- current lease holder ('' when none) so the caller can tell who must act on it.
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {'settled', ''}
end
local owner = redis.call('HGET', KEYS[3], 'owner') or ''
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {'recorded', owner}
end
return {'already_requested', owner}
