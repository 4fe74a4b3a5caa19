-- Acquire an Action's lease.
-- KEYS[1] lease hash, KEYS[2] stored result, KEYS[3] cancel intent, KEYS[4] pending intents,
-- KEYS[5] stored terminal chunk, KEYS[6] stored owed chunks
-- ARGV[1] owner token (unique per delivery attempt), ARGV[2] lease ttl ms, ARGV[3] key ttl ms,
-- ARGV[4] request fingerprint (sha256 of the canonical request), ARGV[5] the Action's
-- verified principal, ARGV[6] its tenant ('' for none), ARGV[7] its capability (recorded so
-- a cancel request can be authorized against the Action it names), ARGV[8] this delivery's
-- chunk-chain key (random; '' for none), kept as `chain_key.{fence}` so that the owner after
-- it can tell the chunks this fence published from chunks forged on the subject
-- (worker/execution/chunk_chain.py), ARGV[9] this delivery's W3C traceparent ('' when
-- untraced), kept so that a takeover's span can link to the owner before it (worker/tracing.py)
-- Guarantees: at most one live owner at a time; every acquisition gets a fence strictly
-- greater than every earlier one (HINCRBY on a field that is never reset); nothing is
-- acquired once a result is stored. Time is Redis TIME, never the caller's clock.
-- Re-running it with the same owner token while it holds the lease returns the same grant,
-- so a call whose reply was lost can be repeated to learn what happened.
-- The first delivery records the request fingerprint; a later delivery of the same Action id
-- with another fingerprint is an idempotency collision and acquires nothing, unless all the
-- id holds is a refusal (settled with `refused`, no unsafe attempt ever recorded): a
-- refused envelope claimed nothing of the id, so its refusal is cleared and this request
-- acquires it (issue 24: a forgery refused first must not burn an approved id).
-- Returns {status, fence, previous_owner, expires_at_ms, attempted_fence, cancel_requested,
--   now_ms, cancel_pending} (now_ms: the Redis time of this step; cancel_pending: intents
--   recorded before any worker knew the Action, for the new owner to authorize), and, when
--   acquired, previous_trace: the traceparent the owner before recorded ('' for none)
--   status: 'settled' | 'held' | 'acquired' | 'collision'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cancel = redis.call('EXISTS', KEYS[3])
local pending = redis.call('EXISTS', KEYS[4])
local recorded = redis.call('HGET', KEYS[1], 'fingerprint')
if recorded and recorded ~= ARGV[4] then
  if redis.call('HGET', KEYS[1], 'refused') ~= '1'
     or tonumber(redis.call('HGET', KEYS[1], 'attempted_fence') or '0') ~= 0 then
    return {'collision', 0, '', 0, 0, cancel, now, pending}
  end
  redis.call('DEL', KEYS[2], KEYS[5], KEYS[6])
  redis.call('HDEL', KEYS[1], 'refused')
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {'settled', 0, '', 0, 0, cancel, now, pending}
end
local owner = redis.call('HGET', KEYS[1], 'owner') or ''
local expires = tonumber(redis.call('HGET', KEYS[1], 'expires_at_ms') or '0')
local fence = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
local attempted = tonumber(redis.call('HGET', KEYS[1], 'attempted_fence') or '0')
if owner == ARGV[1] then
  return {'acquired', fence, owner, expires, attempted, cancel, now, pending}
end
if owner ~= '' and expires > now then
  return {'held', fence, owner, expires, attempted, cancel, now, pending}
end
fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
local until_ms = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'expires_at_ms', until_ms, 'acquired_at_ms', now,
  'fingerprint', ARGV[4], 'principal', ARGV[5], 'tenant', ARGV[6], 'capability', ARGV[7])
if ARGV[8] and ARGV[8] ~= '' then
  redis.call('HSET', KEYS[1], 'chain_key.' .. fence, ARGV[8])
end
local previous_trace = redis.call('HGET', KEYS[1], 'traceparent') or ''
if ARGV[9] and ARGV[9] ~= '' then
  redis.call('HSET', KEYS[1], 'traceparent', ARGV[9])
elseif previous_trace ~= '' then
  redis.call('HDEL', KEYS[1], 'traceparent')
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {'acquired', fence, owner, until_ms, attempted, cancel, now, pending, previous_trace}
