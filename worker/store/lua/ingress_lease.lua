-- Take or renew the lease of one followed channel session (channel ingress).
-- KEYS[1] the session's follower lease
--   (`aip:connector:hermes_agent:channel:v1:{endpoint:session}:lease`, built by
--   `worker.store.keys.IngressKeys`)
-- ARGV[1] owner token (unique per follower), ARGV[2] lease ttl ms
-- Guarantees: at most one follower holds a session's lease at a time; a free (or expired)
-- lease is taken, the holder's own is renewed to a full ttl, anyone else's is left alone.
-- Safe to repeat. Returns 1 when ARGV[1] holds the lease afterwards, else 0.
local owner = redis.call('GET', KEYS[1])
if owner == false or owner == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
  return 1
end
return 0
