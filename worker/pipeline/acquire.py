"""Step 4 of docs/architecture.md §4: the lease acquire, for an execution and a refusal alike.

The acquire records the request's fingerprint (`worker.fingerprints`: an Action id reused
with another request is a collision) and the Action's subject (what a cancel is authorized
against), and answers with a fence. From the acquire on, a failure is repaired by
redelivery and takeover; before it nothing was written for the delivery, so the
pipeline's guard may dead-letter a poison message instead (`reached`).
"""

from __future__ import annotations

import secrets

from nats.aio.msg import Msg

from schemas.action import Action
from worker import tracing
from worker.execution.chunk_chain import new_chain_key
from worker.fingerprints import idempotency_fingerprint
from worker.pipeline.delivery import Delivery
from worker.pipeline.runtime import Runtime
from worker.store.lease_store import ActionSubject, LeaseGrant


def subject_of(action: Action) -> ActionSubject:
    """What a lease records for cancel authorization: the Action's principal (verified by
    admission before any lease that executes), tenant and capability."""
    return ActionSubject(
        principal_id=action.identity.principal_id,
        tenant_id=action.identity.tenant_id,
        capability=action.capability,
    )


class Acquire:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        #: Deliveries (by `id(msg)`) that reached a lease acquire.
        self._reached: set[int] = set()

    def reached(self, msg: Msg) -> bool:
        """True when `msg` got as far as an acquire (see the module docstring)."""
        return id(msg) in self._reached

    def reach(self, msg: Msg) -> None:
        """`msg` wrote state a redelivery repairs (an idempotency claim, the lease)."""
        self._reached.add(id(msg))

    def forget(self, msg: Msg) -> None:
        """The delivery of `msg` is over."""
        self._reached.discard(id(msg))

    async def __call__(
        self, delivery: Delivery, *, to_execute: bool = True
    ) -> tuple[str, LeaseGrant]:
        """A new owner token for this attempt, and the store's answer to it. A resume that
        is to execute is first recorded under its own id, so a cancel naming it finds the
        source Action's keys."""
        rt = self.rt
        owner = f"{rt.worker_id}#{secrets.token_hex(6)}"
        self.reach(delivery.msg)
        if to_execute and delivery.keys.is_resume:
            await rt.stores.leases.remember_resume(delivery.keys)
        trace: dict[str, str] = {}
        tracing.inject(trace)  # this delivery's span, for a takeover to link to
        grant = await rt.stores.leases.acquire(
            delivery.keys,
            owner,
            rt.settings.lease_ttl_ms,
            idempotency_fingerprint(delivery.action),
            subject_of(delivery.action),
            chain_key=new_chain_key(),
            traceparent=trace.get(tracing.TRACEPARENT, ""),
        )
        return owner, grant
