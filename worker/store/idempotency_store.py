"""The Redis side of idempotency keys (docs/guarantees.md "Idempotency keys").

Two scripts, each with its guarantee in its `.lua` file: `idempotency_claim` decides, by
compare-and-set on the key's own record, which Action holds a key; `idempotency_original`
reads, in the holder's slot, whether the holder's stored result answers the keyed request.
The rule that uses them is `worker.pipeline.idempotency`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from worker.store.keys import ActionKeys
from worker.store.scripts import Scripts, reply_text

IDEMPOTENCY_SCRIPTS = ("idempotency_claim", "idempotency_original")


class ClaimStatus(StrEnum):
    #: The caller now holds the key: it runs.
    CLAIMED = "claimed"
    #: The caller already held it (a redelivery of the holder): it runs as before.
    OWN = "own"
    #: Held for another request: refused, nothing sent.
    COLLISION = "collision"
    #: Held for the same request by another Action: its result is the answer.
    DUPLICATE = "duplicate"


@dataclass(frozen=True, slots=True)
class Claim:
    status: ClaimStatus
    #: The Action holding the key, and where its keys live.
    holder: ActionKeys
    #: The request fingerprint the holder claimed it with.
    fingerprint: str


class OriginalStatus(StrEnum):
    SETTLED = "settled"
    #: Queued or running: wait for it.
    PENDING = "pending"
    #: It holds the key in name only (see idempotency_original.lua): the key is free.
    VOID = "void"


@dataclass(frozen=True, slots=True)
class Original:
    status: OriginalStatus
    #: The holder's stored result (SETTLED only).
    result: bytes | None


class IdempotencyStore:
    """The key records and holder reads of one Redis client."""

    def __init__(self, redis: Any, *, ttl_ms: int, call_budget_s: float = 10.0) -> None:
        self.scripts = Scripts(redis, names=IDEMPOTENCY_SCRIPTS)
        self.ttl_ms = ttl_ms
        self.call_budget_s = call_budget_s

    async def claim(
        self, record: str, keys: ActionKeys, fingerprint: str, *, replacing: str = ""
    ) -> Claim:
        """Claim `record` (worker/store/keys.py `idempotency_key`) for the Action of `keys`,
        or learn its holder; `replacing`: a holder found void, replaced only if it still
        holds the key. One round trip."""
        status, holder, slot, claimed = await self.scripts["idempotency_claim"].reasked(
            [record],
            [keys.action_id, keys.slot_action_id, fingerprint, self.ttl_ms, replacing],
            budget_s=self.call_budget_s,
        )
        holder_id, slot_id = reply_text(holder), reply_text(slot)
        return Claim(
            ClaimStatus(reply_text(status)),
            ActionKeys.of(holder_id, source_action_id=slot_id if slot_id != holder_id else None),
            reply_text(claimed),
        )

    async def original(self, holder: ActionKeys, fingerprint: str) -> Original:
        """What the key's holder answered, if it answers the request of `fingerprint`."""
        status, result = await self.scripts["idempotency_original"].reasked(
            [holder.lease, holder.result], [fingerprint], budget_s=self.call_budget_s
        )
        stored = result if isinstance(result, bytes) else reply_text(result).encode()
        return Original(OriginalStatus(reply_text(status)), stored or None)
