-- Read an Action's approval record, its approver's signature, and the Redis clock.
-- KEYS[1] the approvals hash of the Action (`aip:approvals:{act_...}`)
-- Guarantees: the record, its signature and the server's TIME come from one step, so the
-- approval check decides expiry on Redis time without a second round trip (and the
-- admission's replay check uses the same time). Read-only; safe to repeat.
-- Returns {record or '', now_ms, signature or '', signer or ''}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local record = redis.call('HGET', KEYS[1], 'record') or ''
local signature = redis.call('HGET', KEYS[1], 'signature') or ''
local signer = redis.call('HGET', KEYS[1], 'signer') or ''
return {record, now, signature, signer}
