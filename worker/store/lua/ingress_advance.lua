-- Move a followed session's cursor past a message the follower has just published.
-- KEYS[1] the session's follower lease, KEYS[2] its cursor (the last message id on the bus)
-- ARGV[1] owner token, ARGV[2] the message id just published
-- Guarantees: only the lease holder moves the cursor, and only forward (a repeat or an
-- older id leaves it unchanged), so a follower that lost its lease cannot rewind another's
-- progress. Safe to repeat. Returns 1 when ARGV[1] holds the lease, -1 when it does not
-- (nothing is written).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local current = tonumber(redis.call('GET', KEYS[2]) or '-1')
if tonumber(ARGV[2]) > current then redis.call('SET', KEYS[2], ARGV[2]) end
return 1
