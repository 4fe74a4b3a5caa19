-- Read what an idempotency key's holder Action answered, in the holder's own slot.
-- KEYS[1] the holder's lease hash, KEYS[2] its stored result
-- ARGV[1] the request fingerprint the key was claimed with
-- Guarantees: read-only; the answer is the holder's result only if that result answers
-- the keyed request: an Action id that its lease binds to another fingerprint (the id was
-- reused before the key claimed it: its result is another request's), or whose only
-- answer is a refusal nothing was attempted for (it claimed nothing, like the id itself,
-- lease_acquire.lua), holds the key in name only ('void').
-- Returns {status, result}: 'settled' (with the stored result) | 'pending' (not settled
-- yet: the holder is queued or running) | 'void'
local recorded = redis.call('HGET', KEYS[1], 'fingerprint')
if recorded and recorded ~= ARGV[1] then
  return {'void', ''}
end
local result = redis.call('GET', KEYS[2])
if not result then
  return {'pending', ''}
end
if redis.call('HGET', KEYS[1], 'refused') == '1'
   and tonumber(redis.call('HGET', KEYS[1], 'attempted_fence') or '0') == 0 then
  return {'void', ''}
end
return {'settled', result}
