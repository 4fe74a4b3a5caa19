-- Read an Action's approval record together with the Redis clock.
-- KEYS[1] the approvals hash of the Action (`aip:approvals:{act_...}`)
-- Guarantees: the record and the server's TIME come from one step, so the approval check
-- decides expiry on Redis time without a second round trip. Read-only; safe to repeat.
-- Returns {record or '', now_ms}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local record = redis.call('HGET', KEYS[1], 'record') or ''
return {record, now}
