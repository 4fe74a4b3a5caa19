-- Give a followed session's lease back (a worker shutting down), so another follower takes
-- the session at once instead of after the ttl.
-- KEYS[1] the session's follower lease
-- ARGV[1] owner token
-- Guarantees: only the holder's own lease is deleted; anyone else's is left alone. Safe to
-- repeat. Returns 1 when a lease was deleted, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
