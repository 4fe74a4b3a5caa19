-- Attach an operator's reconciliation decision to an outcome_unknown binding.
-- KEYS[1] binding hash; ARGV[1] decision JSON
-- Guarantees: only an outcome_unknown binding takes a decision; the decision is write-once
-- and stored beside the binding document, which stays byte-identical (terminal state, output
-- and error are never rewritten, so the settled AIP result and the binding keep agreeing).
-- Re-running returns 'exists' with the stored decision.
-- Returns {status, stored}: 'recorded' | 'exists' | 'not_unknown' | 'missing'
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  return {'missing', ''}
end
if state ~= 'outcome_unknown' then
  return {'not_unknown', state}
end
if redis.call('HSETNX', KEYS[1], 'reconciliation', ARGV[1]) == 1 then
  return {'recorded', ARGV[1]}
end
return {'exists', redis.call('HGET', KEYS[1], 'reconciliation')}
