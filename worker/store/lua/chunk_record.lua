-- Record the head of an Action's chunk chain: the last chunk whose publication JetStream
-- confirmed, with its hash and stream sequence.
-- KEYS[1] lease hash; ARGV[1] owner token, ARGV[2] fence, ARGV[3] chunk seq,
-- ARGV[4] the chunk's sha256 (hex), ARGV[5] its stream sequence
-- Guarantees: only the owner holding the lease at that fence records (a superseded owner's
-- record is refused), and the recorded seq only grows, so a takeover continues the chain
-- from a chunk a fenced owner published and saw confirmed, never from whatever was last
-- put on the subject.
-- Returns 1 when recorded (or already recorded further), 0 when the caller lost the lease.
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1]
   or redis.call('HGET', KEYS[1], 'fence') ~= ARGV[2] then
  return 0
end
local recorded = tonumber(redis.call('HGET', KEYS[1], 'chunk_seq') or '-1')
if tonumber(ARGV[3]) > recorded then
  redis.call('HSET', KEYS[1], 'chunk_seq', ARGV[3], 'chunk_sha256', ARGV[4],
    'chunk_stream_seq', ARGV[5], 'chunk_fence', ARGV[2])
end
return 1
