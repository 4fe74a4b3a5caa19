-- Record a cancel intent on an operator binding, from outside the lease (the cancel handler).
-- KEYS[1] binding hash
-- Guarantees: the intent is durable before the reply; it is a separate write-once flag, so
-- recording it never races the lease holder's compare-and-set of the binding document (the
-- holder folds the flag into the document on its next write). A terminal binding is not
-- marked, and neither is one waiting for approval: that invocation is no longer active, and
-- cancelling it must not block a later governed resume (spec "Reconcile cancellation").
-- Returns {status, state}: 'recorded' | 'already_requested' | 'inactive' | 'missing'
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  return {'missing', ''}
end
if state == 'completed' or state == 'failed' or state == 'cancelled'
   or state == 'outcome_unknown' or state == 'waiting_for_approval' then
  return {'inactive', state}
end
if redis.call('HSETNX', KEYS[1], 'cancel_requested', '1') == 1 then
  return {'recorded', state}
end
return {'already_requested', state}
