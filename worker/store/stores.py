"""The Redis-backed stores of one worker process, built once at start-up and handed down.

Every part of the runtime that keeps state in Redis receives this one object instead of a
raw client: the leases and results (`LeaseStore`), the operator's bindings, claims and
capacity (`OperatorStore`), the approval records admission checks (`ApprovalRecords`),
channel ingress's session leases and cursors (`IngressStore`), the idempotency key
records (`IdempotencyStore`), and the Redis clock trust
decisions are made at (docs/architecture.md §5). Each store hashes its scripts once, here,
rather than once per Action or in a registry keyed by client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.store.approvals import ApprovalRecords
from worker.store.clock import RedisClock
from worker.store.health import StoreHealth
from worker.store.idempotency_store import IdempotencyStore
from worker.store.ingress_store import IngressStore
from worker.store.lease_store import LeaseStore
from worker.store.operator_store import OperatorStore


@dataclass(frozen=True, slots=True)
class Stores:
    leases: LeaseStore
    operator: OperatorStore
    approvals: ApprovalRecords
    ingress: IngressStore
    idempotency: IdempotencyStore
    #: The client itself, for the few parts that run plain commands of their own (the
    #: health probe, the escalation gauge) and for closing it.
    client: Any

    @classmethod
    def over(
        cls,
        redis: Any,
        *,
        result_ttl_ms: int = 86_400_000,
        idempotency_ttl_ms: int = 86_400_000,
        health: StoreHealth | None = None,
    ) -> Stores:
        """Every store over one client; `health` is the fetch gate acquires consult."""
        return cls(
            leases=LeaseStore(redis, result_ttl_ms=result_ttl_ms, health=health),
            operator=OperatorStore(redis),
            approvals=ApprovalRecords(redis),
            ingress=IngressStore(redis),
            idempotency=IdempotencyStore(redis, ttl_ms=idempotency_ttl_ms),
            client=redis,
        )

    def clock(self) -> RedisClock:
        """A fresh view of Redis time for one decision (it reads `TIME` at most once)."""
        return RedisClock(self.client)
