"""Idempotency keys as AIP defines them (`return_original_result`, docs/guarantees.md
"Idempotency keys"): the one place the rule is decided.

An Action carrying an `idempotency_key` claims the key in its scope before its lease is
acquired (`Idempotency.admit`, called by `Leased.run`). The scope is the capability (AIP
`key_scope: capability`) *and* the Action's tenant and verified principal: a key names a
request of one principal, so a result is only ever returned to the principal whose Action
produced it, and one tenant can never read another's by reusing (or guessing) its key.

- The first Action with the key holds it: it runs as any other.
- A later Action with the same key and the same request (`idempotency_fingerprint`: the
  capability, the canonical input, the delegation) gets the holder's result under its own
  id, naming the holder in `original_action_id`; nothing is sent to Hermes. While the
  holder has not settled, it waits (nak'd, redelivered no later than its own deadline,
  which then refuses it as any late Action), and never starts a run.
- The same key with another request is an idempotency collision: refused with the
  operation's `collision_code`, nothing sent.
- A key equal to the Action's own id claims nothing (`AipClient` sends that when the caller
  gives no key): the lease already makes one id exactly-once, so such an Action pays no
  round trip for a record nobody else could meaningfully name.
- A holder that claimed nothing (its id was another request's, or its only answer is a
  refusal nothing was attempted for) holds the key in name only: the next Action with the
  key, whatever its input, replaces it by compare-and-set and runs.

Exactly-one-start, fencing and `outcome_unknown` are the holder's own: its result, uncertain
or not, is what every later holder of the key gets. The record outlives nothing it
depends on: it lives `idempotency_ttl_ms` from the first claim, at most the result's TTL.

The rule is keyed by the capability, the key and who asks, never by the wire's layout, so
it stays when the Envelope replaces today's wire.
"""

from __future__ import annotations

import hashlib

from schemas.action import Action
from worker import faults
from worker.aip.canonical import canonical_bytes
from worker.errors import ConnectorError, Refusal
from worker.fingerprints import idempotency_fingerprint
from worker.metrics import DeliveryOutcome
from worker.pipeline.acquire import Acquire
from worker.pipeline.answers import Answers
from worker.pipeline.delivery import Delivery
from worker.pipeline.runtime import Runtime
from worker.store.clock import now_ms
from worker.store.idempotency_store import ClaimStatus, OriginalStatus
from worker.store.keys import idempotency_key


def key_record(action: Action, key: str) -> str:
    """The Redis record of `key` in its scope: capability, tenant, principal."""
    scope = {
        "capability": action.capability,
        "tenant": action.identity.tenant_id,
        "principal": action.identity.principal_id,
        "idempotency_key": key,
    }
    return idempotency_key(hashlib.sha256(canonical_bytes(scope)).hexdigest())


class Idempotency:
    def __init__(self, rt: Runtime, acquire: Acquire, answers: Answers) -> None:
        self.rt = rt
        self.acquire = acquire
        self.answers = answers

    async def admit(self, delivery: Delivery) -> bool:
        """True: this delivery holds its key (or has none) and goes on to its lease. False:
        it was answered (the holder's result, a collision) or will come back (the holder
        has not settled)."""
        action = delivery.action
        key = action.idempotency_key
        if key is None or key == action.id:
            # A key that is the Action's own id names that Action only, and the lease
            # already makes an id exactly-once: no record, no round trip. `AipClient`,
            # delegation and every default-keyed Action are this case.
            return True
        store = self.rt.stores.idempotency
        record = key_record(action, key)
        fingerprint = idempotency_fingerprint(action)
        # From here a failure is repaired by redelivery (the holder's comes back `own`),
        # never dead-lettered: a dead-lettered holder would keep its key for the whole TTL.
        self.acquire.reach(delivery.msg)
        claim = await store.claim(record, delivery.keys, fingerprint)
        if claim.status in (ClaimStatus.DUPLICATE, ClaimStatus.COLLISION):
            original = await store.original(claim.holder, claim.fingerprint)
            if original.status is OriginalStatus.VOID:
                claim = await store.claim(
                    record, delivery.keys, fingerprint, replacing=claim.holder.action_id
                )
                if claim.status not in (ClaimStatus.CLAIMED, ClaimStatus.OWN):
                    # Another Action replaced the void holder first: judged against it
                    # when this one comes back.
                    await self.wait(delivery)
                    return False
            elif claim.status is ClaimStatus.COLLISION:
                await self.answers.refuse(delivery, self.collision(delivery))
                return False
            elif original.status is OriginalStatus.SETTLED:
                assert original.result is not None
                await self.answers.replay(delivery, original.result, claim.holder.action_id)
                return False
            else:
                await self.wait(delivery)
                return False
        faults.hit("after_idempotency_claim", action.id)
        return True

    def collision(self, delivery: Delivery) -> Refusal:
        operation = delivery.operation
        assert operation is not None
        return Refusal(
            ConnectorError(
                operation.collision_code,
                "idempotency collision: this idempotency_key was first used with a different "
                "request for this capability",
                uncertain_outcome=False,
            ),
            read_only=operation.spec.read_only,
        )

    async def wait(self, delivery: Delivery) -> None:
        """The key's holder has not settled: come back within the nak delay, and no later
        than this Action's own deadline (whose step then refuses it)."""
        rt = self.rt
        rt.metrics.delivery(delivery.endpoint_id, DeliveryOutcome.WAITING)
        wait_ms = min(rt.settings.nak_delay_ms, max(10, delivery.deadline_ms - now_ms() + 10))
        await self.answers.nak(delivery.msg, wait_ms / 1000)
