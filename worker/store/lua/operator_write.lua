-- Compare-and-set an operator binding under the caller's lease fence.
-- KEYS[1] binding hash, KEYS[2] the caller's lease hash
-- ARGV[1] owner token, ARGV[2] fence, ARGV[3] expected revision, ARGV[4] new binding JSON
-- (its revision is expected + 1), ARGV[5] new state, ARGV[6] key ttl ms
-- Guarantees, checked in one step with the write:
--   * the caller still holds the lease at this fence (a paused or replaced worker writes
--     nothing, however late its call arrives);
--   * the binding is still at the revision the caller read (no lost update);
--   * a terminal binding (completed, failed, cancelled, outcome_unknown) is write-once.
-- Re-running after a lost reply returns 'written' when the stored doc is byte-identical to
-- ARGV[4] at expected + 1, so a retry is also the re-read. That repeat refreshes the key's
-- TTL, a replicated write, so a WAIT after it also covers the original write.
-- Returns {status, doc, revision, cancel_requested, now_ms}: the stored binding after the call
--   status: 'written' | 'conflict' | 'terminal' | 'fenced_out' | 'missing'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local doc = redis.call('HGET', KEYS[1], 'doc')
if not doc then
  return {'missing', '', 0, 0, now}
end
local rev = tonumber(redis.call('HGET', KEYS[1], 'revision') or '0')
local cancel = redis.call('HGET', KEYS[1], 'cancel_requested') and 1 or 0
local expected = tonumber(ARGV[3])
if rev == expected + 1 and doc == ARGV[4] then
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
  return {'written', doc, rev, cancel, now}
end
if redis.call('HGET', KEYS[2], 'owner') ~= ARGV[1]
   or redis.call('HGET', KEYS[2], 'fence') ~= ARGV[2] then
  return {'fenced_out', doc, rev, cancel, now}
end
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'completed' or state == 'failed' or state == 'cancelled'
   or state == 'outcome_unknown' then
  return {'terminal', doc, rev, cancel, now}
end
if rev ~= expected then
  return {'conflict', doc, rev, cancel, now}
end
redis.call('HSET', KEYS[1], 'doc', ARGV[4], 'revision', expected + 1, 'state', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return {'written', ARGV[4], expected + 1, cancel, now}
