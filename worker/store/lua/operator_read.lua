-- Read an operator binding together with the Redis clock.
-- KEYS[1] binding hash
-- Guarantees: one consistent snapshot (doc, revision, cancel flag, reconciliation) plus the
-- server's TIME, so every expiry decision the caller makes uses Redis time, never its own.
-- Read-only; safe to repeat.
-- Returns {doc or '', revision, cancel_requested 0|1, reconciliation or '', now_ms}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local doc = redis.call('HGET', KEYS[1], 'doc')
if not doc then
  return {'', 0, 0, '', now}
end
local rev = tonumber(redis.call('HGET', KEYS[1], 'revision') or '0')
local cancel = redis.call('HGET', KEYS[1], 'cancel_requested') and 1 or 0
local rec = redis.call('HGET', KEYS[1], 'reconciliation') or ''
return {doc, rev, cancel, rec, now}
