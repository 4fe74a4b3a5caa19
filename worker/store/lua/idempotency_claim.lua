-- Claim an idempotency key (in its scope) for an Action, or learn which Action holds it.
-- KEYS[1] the key's record (a hash; worker/store/keys.py `idempotency_key`)
-- ARGV[1] the Action id, ARGV[2] the id whose hash tag holds its keys (a resume's source;
-- else ARGV[1]), ARGV[3] its request fingerprint (worker/fingerprints.py
-- `idempotency_fingerprint`), ARGV[4] the key's TTL ms, ARGV[5] the holder this caller found
-- void ('' for none): replace it only if it still holds the key
-- Guarantees: one holder per key at a time, set by compare-and-set; the record lives ARGV[4]
-- ms from the first claim (a void holder's replacement starts a new TTL); a second
-- fingerprint under a held key never replaces the holder. Re-running it after a lost
-- reply answers 'own' (the caller holds the key), so a call can be repeated.
-- Returns {status, holder id, holder slot id, the fingerprint the holder claimed it with}:
--   'claimed'   the caller now holds the key (the first, or it replaced the void holder)
--   'own'       the caller already held it (a redelivery of the holder)
--   'collision' the key is held for another fingerprint (nothing written)
--   'duplicate' another Action holds it for the same fingerprint: its result is the answer
local holder = redis.call('HGET', KEYS[1], 'action_id')
if holder == ARGV[1] then
  return {'own', holder, redis.call('HGET', KEYS[1], 'slot_action_id') or holder, ARGV[3]}
end
if holder and holder ~= ARGV[5] then
  local slot = redis.call('HGET', KEYS[1], 'slot_action_id') or holder
  local claimed = redis.call('HGET', KEYS[1], 'fingerprint') or ''
  if claimed ~= ARGV[3] then
    return {'collision', holder, slot, claimed}
  end
  return {'duplicate', holder, slot, claimed}
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'action_id', ARGV[1], 'slot_action_id', ARGV[2],
  'fingerprint', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {'claimed', ARGV[1], ARGV[2], ARGV[3]}
