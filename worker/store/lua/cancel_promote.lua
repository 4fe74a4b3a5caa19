-- Settle the pending cancel intents of an Action its new owner has just leased.
-- KEYS[1] cancel intent, KEYS[2] pending intents hash
-- ARGV[1] the intent JSON of an authorized requester ('' when none was authorized),
-- ARGV[2] key ttl ms
-- Guarantees: only an intent the leasing worker authorized against the Action's principal
-- becomes the durable cancel intent (kept first-wins like cancel_request); unauthorized
-- pending intents are dropped. Safe to repeat.
-- Returns 1 when a durable cancel intent exists afterwards, else 0.
if ARGV[1] ~= '' then
  redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
end
redis.call('DEL', KEYS[2])
return redis.call('EXISTS', KEYS[1])
