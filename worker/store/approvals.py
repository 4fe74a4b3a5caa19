"""The approval records in Redis: one hash per Action at `approvals_key(action_id)`, one
slot per approver in it (a quorum needs several distinct approvers' decisions).

This module reads and writes them (`approval_read.lua`, `approval_write.lua`, each with its
guarantee in its file); whether the records authorize a run (their signatures, their
approvers' memberships, expiry, the quorum) is decided in `worker.trust.approval_ledger`.
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
    #: Another decision stands: a denial, the approver's own live approval, or a met quorum.
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


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """What `approval_write.lua` did: its status, the record it returned (the one written
    or the one that blocks the write; None: none readable) and the live approvals after."""

    status: DecisionWrite
    stored: ApprovalRecord | None
    live: int


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
    ) -> list[ApprovalRecord]:
        """Every approver's stored decision on an Action (oldest first); raises
        ConnectorError when unreadable.

        A transient failure (a Redis Cluster failover, a restart) is retried within
        `budget_s`: refusing the Action would settle it `failed` for an outage the lease
        store rides out.
        """
        stored = (await self.read_at(action_id, budget_s=budget_s))[0]
        return [decision.record for decision in stored]

    async def read_at(
        self, action_id: str, *, budget_s: float = READ_BUDGET_S
    ) -> tuple[list[StoredDecision], int]:
        """Every stored decision with its signature (oldest first), and the Redis time of
        the same step (one script, one round trip)."""
        try:
            now, _revision, flat = await self._read.reasked(
                [approvals_key(action_id)], budget_s=budget_s
            )
        except (StoreUnavailable, RedisError) as exc:
            raise ConnectorError(
                ErrorCode.HOST_APPROVAL_AUTHORIZATION_UNAVAILABLE,
                f"approval record could not be read: {exc}",
            ) from None
        decisions = []
        for index in range(0, len(flat) - 2, 3):
            raw, signature, signer = flat[index : index + 3]
            record = _decode_record(raw)
            if record is not None:
                decisions.append(
                    StoredDecision(
                        record=record,
                        raw=_raw(raw),
                        signature=reply_text(signature),
                        signer=reply_text(signer),
                    )
                )
        decisions.sort(key=lambda d: (d.record.created_at_unix_ms, d.record.decision_id))
        return decisions, int(now)

    async def revision(self, action_id: str) -> int:
        """The revision of the Action's decisions (0: none yet), for `write`."""
        return int(reply_text(await self.redis.hget(approvals_key(action_id), "revision") or "0"))

    async def write(
        self,
        record: ApprovalRecord,
        signed: bytes,
        signature: str,
        signer: str,
        *,
        read_revision: int,
        required: int,
    ) -> WriteOutcome:
        """Store `record` (whose encoding is `signed`) with its approver's signature in its
        approver's slot, if the decisions are still at `read_revision` and no denial or met
        quorum of `required` approvals stands."""
        status, stored, live = await self._write(
            keys=[approvals_key(record.action_id)],
            args=[
                record.approver_principal_id,
                record.decision_id,
                signed,
                read_revision,
                record.decision.value,
                record.expires_at_unix_ms,
                RETAIN_AFTER_EXPIRY_MS,
                signature,
                signer,
                required,
            ],
        )
        try:
            existing = _decode_record(stored)
        except ConnectorError:
            existing = None
        return WriteOutcome(DecisionWrite(reply_text(status)), existing, int(live))


def slot_fields(
    record: ApprovalRecord, raw: bytes, *, signature: str, signer: str
) -> dict[str, bytes | str | int]:
    """The hash fields `approval_write.lua` writes for one approver's decision (the layout
    the scripts share): for tests and tools that must write a slot as anyone with Redis
    write access could, bypassing the script."""
    who = record.approver_principal_id
    return {
        f"id:{who}": record.decision_id,
        f"record:{who}": raw,
        f"decision:{who}": record.decision.value,
        f"expires:{who}": record.expires_at_unix_ms,
        f"signature:{who}": signature,
        f"signer:{who}": signer,
        "revision": record.revision,
    }


async def read_records(
    redis: Any, action_id: str, *, budget_s: float = READ_BUDGET_S
) -> list[ApprovalRecord]:
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
