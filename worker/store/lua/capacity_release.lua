-- Give an endpoint run slot back (the run is terminal, or its binding was abandoned).
-- KEYS[1] the endpoint's capacity sorted set; ARGV[1] holder
-- Guarantees: removes only that holder's slot; releasing twice is harmless.
-- Returns 1 when a slot was released, 0 when the holder had none.
return redis.call('ZREM', KEYS[1], ARGV[1])
