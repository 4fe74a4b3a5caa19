-- Create an Action's operator binding, once, under the caller's lease fence.
-- KEYS[1] binding hash, KEYS[2] the caller's lease hash
-- ARGV[1] owner token, ARGV[2] fence, ARGV[3] binding JSON (revision 1), ARGV[4] state,
-- ARGV[5] key ttl ms
-- Guarantees: the first binding of an Action wins and is never replaced by a later create
-- (concurrent deliveries all observe that one binding); a caller that no longer holds the
-- lease at this fence creates nothing. Re-running it returns 'exists' with the stored doc,
-- which is the caller's own when its first run succeeded; that repeat refreshes the key's
-- TTL, a replicated write, so a WAIT after it also covers the original create.
-- Returns {status, doc, revision, cancel_requested, now_ms}
--   status: 'created' | 'exists' | 'fenced_out'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local doc = redis.call('HGET', KEYS[1], 'doc')
if doc then
  local rev = tonumber(redis.call('HGET', KEYS[1], 'revision') or '0')
  local cancel = redis.call('HGET', KEYS[1], 'cancel_requested') and 1 or 0
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return {'exists', doc, rev, cancel, now}
end
if redis.call('HGET', KEYS[2], 'owner') ~= ARGV[1]
   or redis.call('HGET', KEYS[2], 'fence') ~= ARGV[2] then
  return {'fenced_out', '', 0, 0, now}
end
redis.call('HSET', KEYS[1], 'doc', ARGV[3], 'revision', 1, 'state', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {'created', ARGV[3], 1, 0, now}
