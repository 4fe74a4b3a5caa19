"""The approval records in Redis: one hash per Action at `approvals_key(action_id)`.

This module reads and writes them (`approval_read.lua`, `approval_write.lua`, each with its
guarantee in its file); whether a record authorizes a run (its signature, its approver's
membership, its expiry) is decided in `worker.trust.approval_ledger`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import msgspec
from redis.exceptions import RedisError

from schemas.approval import ApprovalRecord
from schemas.errors import ErrorCode
from worker.errors import ConnectorError, StoreUnavailable
from worker.store.keys import approvals_key
from worker.store.scripts import Script, reply_text, script_source

#: How long a transient Redis failure may delay reading a decision (the stores' budget).
READ_BUDGET_S = 10.0
#: Decisions stay readable for audit this long after they expire.
RETAIN_AFTER_EXPIRY_MS = 24 * 3_600 * 1_000

_decoder = msgspec.json.Decoder(ApprovalRecord)


def _raw(value: Any) -> bytes:
    return value if isinstance(value, bytes) else reply_text(value).encode()


class DecisionWrite(StrEnum):
    """What `approval_write.lua` did with a decision."""

    WRITTEN = "written"
    #: The same decision was already recorded (a repeat after a lost reply).
    EXISTS = "exists"
    #: Another decision stands (a denial, or a live approval).
    CONFLICT = "conflict"
    #: The record changed since the caller read its revision.
    STALE = "stale"
    #: The decision would already have expired.
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class StoredDecision:
    """A decision as Redis holds it: the record, the exact bytes its approver signed, and
    the signature stored beside them (empty when none was)."""

    record: ApprovalRecord
    raw: bytes
    signature: str
    signer: str


class ApprovalRecords:
    """The approval records of one Redis client: built once with the worker's stores
    (`worker.store.stores.Stores`), so the read script is hashed once per client, not per
    Action."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        # Read-only: the workers' Redis user may read approval records, never write one.
        self._read = Script(
            redis, script_source("approval_read"), read_only=True, name="approval_read"
        )
        self._write = Script(redis, script_source("approval_write"), name="approval_write")

    async def read(
        self, action_id: str, *, budget_s: float = READ_BUDGET_S
    ) -> ApprovalRecord | None:
        """The stored decision for an Action, or None; raises ConnectorError when unreadable.

        A transient failure (a Redis Cluster failover, a restart) is retried within
        `budget_s`: refusing the Action would settle it `failed` for an outage the lease
        store rides out.
        """
        stored = (await self.read_at(action_id, budget_s=budget_s))[0]
        return stored.record if stored is not None else None

    async def read_at(
        self, action_id: str, *, budget_s: float = READ_BUDGET_S
    ) -> tuple[StoredDecision | None, int]:
        """The stored decision with its signature, and the Redis time of the same step (one
        script, one round trip)."""
        try:
            raw, now, signature, signer = await self._read.reasked(
                [approvals_key(action_id)], budget_s=budget_s
            )
        except (StoreUnavailable, RedisError) as exc:
            raise ConnectorError(
                ErrorCode.HOST_APPROVAL_AUTHORIZATION_UNAVAILABLE,
                f"approval record could not be read: {exc}",
            ) from None
        record = _decode_record(raw)
        if record is None:
            return None, int(now)
        return (
            StoredDecision(
                record=record,
                raw=_raw(raw),
                signature=reply_text(signature),
                signer=reply_text(signer),
            ),
            int(now),
        )

    async def revision(self, action_id: str) -> int:
        """The revision of the Action's record (0: no decision yet), for `write`."""
        return int(reply_text(await self.redis.hget(approvals_key(action_id), "revision") or "0"))

    async def write(
        self,
        record: ApprovalRecord,
        signed: bytes,
        signature: str,
        signer: str,
        *,
        read_revision: int,
    ) -> tuple[DecisionWrite, ApprovalRecord | None]:
        """Store `record` (whose encoding is `signed`) with its approver's signature, if
        the record is still at `read_revision`; with what was stored before (None: nothing,
        or nothing readable)."""
        status, stored = await self._write(
            keys=[approvals_key(record.action_id)],
            args=[
                record.decision_id,
                signed,
                read_revision,
                record.decision.value,
                record.expires_at_unix_ms,
                RETAIN_AFTER_EXPIRY_MS,
                signature,
                signer,
            ],
        )
        try:
            existing = _decode_record(stored)
        except ConnectorError:
            existing = None
        return DecisionWrite(reply_text(status)), existing


async def read_record(
    redis: Any, action_id: str, *, budget_s: float = READ_BUDGET_S
) -> ApprovalRecord | None:
    """`ApprovalRecords.read` for a one-shot command that holds only a client."""
    return await ApprovalRecords(redis).read(action_id, budget_s=budget_s)


def _decode_record(raw: Any) -> ApprovalRecord | None:
    if not raw:
        return None
    try:
        return _decoder.decode(_raw(raw))
    except msgspec.DecodeError:
        raise ConnectorError(
            ErrorCode.HOST_APPROVAL_AUTHORIZATION_UNAVAILABLE,
            "stored approval record is not a valid ApprovalRecord",
        ) from None
