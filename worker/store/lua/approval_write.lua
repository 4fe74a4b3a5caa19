-- Record one approver's decision on an Action (one slot per approver principal).
-- KEYS[1] approvals hash (aip:approvals:{act_…})
-- ARGV[1] approver principal id, ARGV[2] decision id, ARGV[3] ApprovalRecord JSON,
--   ARGV[4] revision the caller read (0: no decision yet), ARGV[5] decision ('approved' |
--   'denied'), ARGV[6] expires_at ms, ARGV[7] how long the key outlives the latest expiry,
--   in ms, ARGV[8] the approver's signature over ARGV[3] (base64url), ARGV[9] the public nkey
--   that made it, ARGV[10] N: the approvals the capability's quorum requires
-- Fields: 'revision' (every write +1), 'denied' (the denying approver, once), and per
-- approver P: 'id:P', 'record:P', 'decision:P', 'expires:P', 'signature:P', 'signer:P'.
-- The worker verifies every signature against the approver's membership when the Action
-- runs; this script only stores each beside the record it covers.
-- Guarantees: a decision id is written once and never changed (re-running the same write
-- after a lost reply returns 'exists'); a denial by any approver is final for the Action;
-- once N distinct approvers hold live approvals (the quorum that authorizes a run) nothing
-- more is written, so a decision that authorized a run is never swapped or contradicted;
-- an approver's own live approval is never replaced (the same member twice counts once),
-- only an expired one, at revision + 1 (compare-and-set on the revision the caller read).
-- An already expired decision is never written. Time is Redis TIME.
-- Returns {status, blocking_or_stored_record, live approvals after the call}:
--   'written' | 'exists' | 'conflict' | 'stale' | 'expired'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local who = ARGV[1]
local function live_approvals()
  local count, last = 0, ''
  local fields = redis.call('HGETALL', KEYS[1])
  for i = 1, #fields, 2 do
    local name = fields[i]
    if string.sub(name, 1, 9) == 'decision:' and fields[i + 1] == 'approved' then
      local p = string.sub(name, 10)
      if tonumber(redis.call('HGET', KEYS[1], 'expires:' .. p) or '0') > now then
        count = count + 1
        last = redis.call('HGET', KEYS[1], 'record:' .. p) or ''
      end
    end
  end
  return count, last
end
local own_id = redis.call('HGET', KEYS[1], 'id:' .. who)
local own = redis.call('HGET', KEYS[1], 'record:' .. who) or ''
local live, last = live_approvals()
if own_id == ARGV[2] then
  if own == ARGV[3] then
    return {'exists', own, live}
  end
  return {'conflict', own, live}
end
local revision = tonumber(redis.call('HGET', KEYS[1], 'revision') or '0')
if revision ~= tonumber(ARGV[4]) then
  return {'stale', own, live}
end
local denier = redis.call('HGET', KEYS[1], 'denied')
if denier then
  return {'conflict', redis.call('HGET', KEYS[1], 'record:' .. denier) or '', live}
end
if live >= tonumber(ARGV[10]) then
  return {'conflict', last, live}
end
if own_id and redis.call('HGET', KEYS[1], 'decision:' .. who) == 'approved'
    and tonumber(redis.call('HGET', KEYS[1], 'expires:' .. who) or '0') > now then
  return {'conflict', own, live}
end
if tonumber(ARGV[6]) <= now then
  return {'expired', '', live}
end
redis.call('HSET', KEYS[1], 'id:' .. who, ARGV[2], 'record:' .. who, ARGV[3],
  'decision:' .. who, ARGV[5], 'expires:' .. who, ARGV[6], 'signature:' .. who, ARGV[8],
  'signer:' .. who, ARGV[9], 'revision', revision + 1)
if ARGV[5] == 'denied' then
  redis.call('HSET', KEYS[1], 'denied', who)
else
  live = live + 1
end
local keep = tonumber(ARGV[6]) + tonumber(ARGV[7])
local kept = tonumber(redis.call('HGET', KEYS[1], 'kept_until') or '0')
if keep > kept then
  redis.call('HSET', KEYS[1], 'kept_until', keep)
  redis.call('PEXPIREAT', KEYS[1], keep)
end
return {'written', ARGV[3], live}
