-- Read every approver's decision on an Action, with its signature, and the Redis clock.
-- KEYS[1] the approvals hash of the Action (`aip:approvals:{act_...}`)
-- Guarantees: the decisions, their signatures and the server's TIME come from one step, so
-- the approval check counts a quorum on one consistent state and decides expiry on Redis
-- time without a second round trip (and the admission's replay check uses the same time).
-- Read-only; safe to repeat.
-- Returns {now_ms, revision, {record, signature, signer, record, signature, signer, ...}}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local fields = redis.call('HGETALL', KEYS[1])
local decisions = {}
for i = 1, #fields, 2 do
  local name = fields[i]
  if string.sub(name, 1, 7) == 'record:' then
    local who = string.sub(name, 8)
    decisions[#decisions + 1] = fields[i + 1]
    decisions[#decisions + 1] = redis.call('HGET', KEYS[1], 'signature:' .. who) or ''
    decisions[#decisions + 1] = redis.call('HGET', KEYS[1], 'signer:' .. who) or ''
  end
end
return {now, tonumber(redis.call('HGET', KEYS[1], 'revision') or '0'), decisions}
