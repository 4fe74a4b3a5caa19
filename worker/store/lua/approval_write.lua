-- Record one approval decision for an Action.
-- KEYS[1] approvals hash (aip:approvals:{act_…})
-- ARGV[1] decision id, ARGV[2] ApprovalRecord JSON, ARGV[3] revision the caller read
--   (0: no decision yet), ARGV[4] decision ('approved' | 'denied'), ARGV[5] expires_at ms,
--   ARGV[6] how long the key outlives the decision's expiry, in ms, ARGV[7] the approver's
--   signature over ARGV[2] (base64url), ARGV[8] the public nkey that made it
-- The worker verifies the signature against the approver's membership when the Action runs;
-- this script only stores it beside the record it covers.
-- Guarantees: a decision id is written once and never changed (re-running the same write
-- after a lost reply returns 'exists'); a denial is final, and an approval cannot be replaced
-- while it is live, so a decision that authorized a run is never silently swapped; only an
-- expired approval may be followed by a new decision, at revision + 1 (compare-and-set on the
-- revision the caller read). An already expired decision is never written. Time is Redis TIME.
-- Returns {status, stored_record}: 'written' | 'exists' | 'conflict' | 'stale' | 'expired'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local current = redis.call('HGET', KEYS[1], 'decision_id')
local stored = redis.call('HGET', KEYS[1], 'record') or ''
if current == ARGV[1] then
  if stored == ARGV[2] then
    return {'exists', stored}
  end
  return {'conflict', stored}
end
local revision = tonumber(redis.call('HGET', KEYS[1], 'revision') or '0')
if revision ~= tonumber(ARGV[3]) then
  return {'stale', stored}
end
if current then
  local expires = tonumber(redis.call('HGET', KEYS[1], 'expires_at_ms') or '0')
  if redis.call('HGET', KEYS[1], 'decision') ~= 'approved' or expires > now then
    return {'conflict', stored}
  end
end
if tonumber(ARGV[5]) <= now then
  return {'expired', ''}
end
redis.call('HSET', KEYS[1], 'decision_id', ARGV[1], 'record', ARGV[2], 'decision', ARGV[4],
  'expires_at_ms', ARGV[5], 'revision', revision + 1, 'signature', ARGV[7], 'signer', ARGV[8])
redis.call('PEXPIREAT', KEYS[1], tonumber(ARGV[5]) + tonumber(ARGV[6]))
return {'written', ARGV[2]}
