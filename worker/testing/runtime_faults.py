"""Break one runtime-store invariant at a time, around the real gateway's store writer.

The delegation resolver must refuse a child whose records are wrong in exactly one way (an
altered contract, a forged owner, tenant drift, stores that disagree, ...). The gateway
writes correct records, so tests wrap its `RuntimeStoreWriter` with `FaultyStoreWriter`,
which bends what is written and nothing else: the child is still decoded, routed,
dispatched and followed by the production code. It also keeps every child the gateway
asked it to record (`requested`), which is what Hermes' `aip_call` carried.

```python
gateway = Gateway(settings, make_writer=FaultyStoreWriter)
gateway.writer.fault = RuntimeFault.FORGED_OWNER
```
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum

from msgspec.structs import replace

from schemas.delegation import ACTION_WRITE_SCOPE, ChildAction
from schemas.ids import new_action_id
from schemas.lifecycle import LifecycleRecord, LifecycleState, QueueRecord
from worker.aip.signing import AipSigner
from worker.gateway.records import RuntimeStoreWriter


class RuntimeFault(StrEnum):
    """One broken invariant at a time (what `verify_child` must refuse, or accept)."""

    NONE = "none"
    #: The call is answered, but no record of the child is ever written.
    NOT_CREATED = "not_created"
    #: The child is recorded under a generated id instead of the delegated `action_id`.
    REPLACED_ACTION_ID = "replaced_action_id"
    #: The recorded child's input differs from the delegated contract.
    ALTERED_INPUT = "altered_input"
    #: The runtime adds trusted `_aip` memory enrichment (must still verify).
    MEMORY_ENRICHED = "memory_enriched"
    #: The queue entry is owned by another principal than the delegate.
    FORGED_OWNER = "forged_owner"
    #: The child's identity is not the transport-authenticated one.
    IDENTITY_INTEGRITY = "identity_integrity"
    #: The authentication that created the child has expired.
    EXPIRED_AUTH = "expired_auth"
    #: The authenticated principal lacks `action:write`.
    NO_WRITE_SCOPE = "no_write_scope"
    #: The child lives in another tenant partition.
    TENANT_DRIFT = "tenant_drift"
    #: The creator's tenant membership has expired.
    TENANT_EXPIRED = "tenant_expired"
    #: The queue says completed, the lifecycle failed.
    STORES_DISAGREE = "stores_disagree"
    #: The queue entry turns terminal but no lifecycle result is ever written.
    NO_RESULT = "no_result"
    #: The records stay `running` forever.
    NEVER_SETTLES = "never_settles"
    #: The records carry no signature.
    UNSIGNED = "unsigned"


def _past_ms() -> int:
    return time.time_ns() // 1_000_000 - 60_000


@dataclass
class FaultyStoreWriter(RuntimeStoreWriter):
    fault: RuntimeFault = RuntimeFault.NONE
    #: Every child the gateway asked to enqueue, in order (the arguments of each aip_call).
    requested: list[ChildAction] = field(default_factory=list)
    _replaced: dict[str, str] = field(default_factory=dict)

    async def create_queue_entry(self, record: QueueRecord) -> None:
        self.requested.append(record.action)
        if self.fault is RuntimeFault.NOT_CREATED:
            return
        await super().create_queue_entry(self._bend(record))

    async def update_queue_entry(self, record: QueueRecord) -> None:
        if self.fault is RuntimeFault.NOT_CREATED:
            return
        if self.fault is RuntimeFault.NEVER_SETTLES and record.state.terminal:
            return
        await super().update_queue_entry(self._bend(record))

    async def write_lifecycle(self, record: LifecycleRecord) -> None:
        if self.fault in (RuntimeFault.NOT_CREATED, RuntimeFault.NEVER_SETTLES):
            return
        if self.fault is RuntimeFault.NO_RESULT:
            return
        if self.fault is RuntimeFault.STORES_DISAGREE and record.result is not None:
            failed = LifecycleState.FAILED
            record = replace(record, state=failed, result=replace(record.result, status="failed"))
        if self.fault is RuntimeFault.REPLACED_ACTION_ID:
            record = replace(record, action_id=self._replacement(record.action_id))
        await super().write_lifecycle(record)

    def _signer_now(self) -> AipSigner | None:
        self.sign = self.fault is not RuntimeFault.UNSIGNED
        return super()._signer_now()

    def _replacement(self, action_id: str) -> str:
        return self._replaced.setdefault(action_id, new_action_id())

    def _bend(self, record: QueueRecord) -> QueueRecord:
        fault = self.fault
        action = record.action
        authenticated = record.authenticated
        if fault is RuntimeFault.REPLACED_ACTION_ID:
            action = replace(action, id=self._replacement(action.id))
        elif fault is RuntimeFault.ALTERED_INPUT:
            action = replace(action, input={**action.input, "rewritten_by_model": True})
        elif fault is RuntimeFault.MEMORY_ENRICHED:
            action = replace(action, memory={**(action.memory or {}), "_aip": {"enriched": True}})
        elif fault is RuntimeFault.IDENTITY_INTEGRITY:
            action = replace(action, identity=replace(action.identity, principal_kind="user"))
        elif fault is RuntimeFault.EXPIRED_AUTH:
            authenticated = replace(authenticated, expires_at_unix_ms=_past_ms())
        elif fault is RuntimeFault.NO_WRITE_SCOPE:
            kept = [s for s in authenticated.scopes if s != ACTION_WRITE_SCOPE]
            authenticated = replace(authenticated, scopes=kept)
        elif fault is RuntimeFault.TENANT_EXPIRED:
            authenticated = replace(authenticated, tenant_expires_at_unix_ms=_past_ms())
        record = replace(record, action=action, authenticated=authenticated)
        if fault is RuntimeFault.FORGED_OWNER:
            record = replace(record, owner_principal_id="agent:intruder")
        elif fault is RuntimeFault.TENANT_DRIFT:
            record = replace(record, tenant_partition="tenant-elsewhere")
        return record
