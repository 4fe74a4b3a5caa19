-- Persist an authorized cancel intent for an Action (before, during or after its execution).
-- KEYS[1] cancel intent, KEYS[2] result, KEYS[3] lease hash, KEYS[4] pending intents hash
-- ARGV[1] intent JSON, ARGV[2] key ttl ms, ARGV[3] requested_by,
-- ARGV[4] the Action principal the caller authorized against ('' when the Action was not
--   known yet), ARGV[5] most pending intents kept per Action
-- Guarantees: the intent is durable before the reply says `recorded`; an Action that is
-- already settled is not marked (its result stands); the first intent is kept. The caller
-- authorized the requester against the principal the lease records (written by
-- lease_acquire); if that changed meanwhile nothing is written ('changed': authorize again).
-- For an Action no worker has leased yet the intent is kept per requester in the pending
-- hash (at most ARGV[5] requesters), authorized by the worker that leases the Action;
-- only the cancel intent key (KEYS[1]) ever cancels anything.
-- Returns {state, owner, principal}: 'settled' | 'recorded' | 'already_requested' |
-- 'pending' | 'pending_full' | 'changed'; owner is the current lease holder ('' when none).
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {'settled', '', ''}
end
local owner = redis.call('HGET', KEYS[3], 'owner') or ''
local principal = redis.call('HGET', KEYS[3], 'principal') or ''
if principal ~= ARGV[4] then
  return {'changed', owner, principal}
end
if principal == '' then
  if redis.call('HEXISTS', KEYS[4], ARGV[3]) == 0
     and redis.call('HLEN', KEYS[4]) >= tonumber(ARGV[5]) then
    return {'pending_full', '', ''}
  end
  redis.call('HSETNX', KEYS[4], ARGV[3], ARGV[1])
  redis.call('PEXPIRE', KEYS[4], ARGV[2])
  return {'pending', '', ''}
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {'recorded', owner, principal}
end
return {'already_requested', owner, principal}
