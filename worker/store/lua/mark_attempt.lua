-- Record, before an unsafe provider request is sent, that this fence is sending it.
-- KEYS[1] lease hash; ARGV[1] owner token, ARGV[2] fence
-- Guarantees: a later owner that finds attempted_fence set (and no result) knows a previous
-- owner may have reached Hermes, and settles an uncertain outcome instead of sending again.
-- Returns 1 when recorded, 0 when the caller no longer holds the lease (send nothing).
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1]
   or redis.call('HGET', KEYS[1], 'fence') ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], 'attempted_fence', ARGV[2])
return 1
