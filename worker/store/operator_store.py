"""Operator bindings and endpoint run slots: the store side of the governed operator.

The binding of one source Action lives in one hash (`binding` of `ActionKeys`):

* `doc`: the OperatorBinding JSON, written only by the lease holder through compare-and-set
  on `revision` (`operator_create`, `operator_write`), terminal states write-once;
* `revision`, `state`: mirrored from the doc so the scripts can decide without parsing JSON;
* `cancel_requested`: a write-once flag the cancel handler may set without holding the lease
  (`operator_mark_cancel`); the holder folds it into the doc on its next write;
* `reconciliation`: an operator's write-once decision about an `outcome_unknown` binding.

Every call is one script on one slot and shares the lease store's retry discipline: an
ambiguous failure is retried with the same arguments (each script answers a repeat with what
the first run did), calls are shielded from cancellation, and a budget bounds the retries.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker.store.keys import ActionKeys, capacity_key
from worker.store.lease_store import StoreUnavailable
from worker.store.scripts import Scripts

T = TypeVar("T")

OPERATOR_SCRIPTS = (
    "operator_read",
    "operator_create",
    "operator_write",
    "operator_mark_cancel",
    "operator_reconcile",
    "capacity_acquire",
    "capacity_release",
)

#: A binding outlives the 24-hour idempotency window of its Action by an hour, so a replay
#: answered from the stored result never finds the binding already gone.
DEFAULT_BINDING_TTL_MS = 86_400_000 + 3_600_000

_AMBIGUOUS = (RedisConnectionError, RedisTimeoutError, OSError, asyncio.TimeoutError)


class WriteStatus(StrEnum):
    CREATED = "created"
    EXISTS = "exists"
    WRITTEN = "written"
    CONFLICT = "conflict"
    TERMINAL = "terminal"
    FENCED_OUT = "fenced_out"
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class StoredBinding:
    """One consistent view of a binding hash, with the Redis clock of the same step."""

    doc: bytes | None
    revision: int
    cancel_requested: bool
    now_ms: int
    reconciliation: bytes | None = None


@dataclass(frozen=True, slots=True)
class WriteReply:
    """What a create or compare-and-set did, and the binding it left stored."""

    status: WriteStatus
    stored: StoredBinding


class MarkStatus(StrEnum):
    RECORDED = "recorded"
    ALREADY_REQUESTED = "already_requested"
    #: Terminal, or waiting for approval: no active invocation exists to reconcile a cancel.
    INACTIVE = "inactive"
    MISSING = "missing"


class ReconcileStatus(StrEnum):
    RECORDED = "recorded"
    EXISTS = "exists"
    NOT_UNKNOWN = "not_unknown"
    MISSING = "missing"


def _b(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode()


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class OperatorStore:
    """Typed calls over the operator and capacity scripts of one Redis client."""

    def __init__(
        self,
        redis: Any,
        *,
        binding_ttl_ms: int = DEFAULT_BINDING_TTL_MS,
        call_budget_s: float = 10.0,
    ) -> None:
        self.redis = redis
        self.scripts = Scripts(redis, names=OPERATOR_SCRIPTS)
        self.binding_ttl_ms = binding_ttl_ms
        self.call_budget_s = call_budget_s

    async def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        deadline = time.monotonic() + self.call_budget_s
        delay = 0.02
        while True:
            try:
                return await asyncio.shield(fn())
            except _AMBIGUOUS as exc:
                if time.monotonic() + delay > deadline:
                    raise StoreUnavailable(f"redis did not answer: {type(exc).__name__}") from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    # --- bindings --------------------------------------------------------------------------

    async def read(self, binding_key: str) -> StoredBinding:
        reply = await self._call(lambda: self.scripts["operator_read"](keys=[binding_key]))
        doc, revision, cancel, reconciliation, now = reply
        doc_bytes = _b(doc)
        rec_bytes = _b(reconciliation)
        return StoredBinding(
            doc=doc_bytes or None,
            revision=int(revision),
            cancel_requested=bool(int(cancel)),
            now_ms=int(now),
            reconciliation=rec_bytes or None,
        )

    async def create(
        self, keys: ActionKeys, owner: str, fence: int, doc: bytes, state: str
    ) -> WriteReply:
        reply = await self._call(
            lambda: self.scripts["operator_create"](
                keys=[keys.binding, keys.lease],
                args=[owner, fence, doc, state, self.binding_ttl_ms],
            )
        )
        return _write_reply(reply)

    async def write(
        self,
        keys: ActionKeys,
        owner: str,
        fence: int,
        expected_revision: int,
        doc: bytes,
        state: str,
    ) -> WriteReply:
        reply = await self._call(
            lambda: self.scripts["operator_write"](
                keys=[keys.binding, keys.lease],
                args=[owner, fence, expected_revision, doc, state, self.binding_ttl_ms],
            )
        )
        return _write_reply(reply)

    async def mark_cancel(self, binding_key: str) -> tuple[MarkStatus, str]:
        reply = await self._call(lambda: self.scripts["operator_mark_cancel"](keys=[binding_key]))
        status, state = reply
        return MarkStatus(_s(status)), _s(state)

    async def record_reconciliation(
        self, binding_key: str, decision: bytes
    ) -> tuple[ReconcileStatus, bytes]:
        reply = await self._call(
            lambda: self.scripts["operator_reconcile"](keys=[binding_key], args=[decision])
        )
        status, stored = reply
        return ReconcileStatus(_s(status)), _b(stored)

    # --- endpoint capacity -----------------------------------------------------------------

    async def capacity_acquire(
        self, endpoint_id: str, holder: str, limit: int, ttl_ms: int, *, force: bool = False
    ) -> tuple[bool, int]:
        """Take (or refresh) the holder's slot; (acquired, holders now)."""
        key = capacity_key(endpoint_id)
        reply = await self._call(
            lambda: self.scripts["capacity_acquire"](
                keys=[key], args=[holder, limit, ttl_ms, "1" if force else "0"]
            )
        )
        acquired, holders, _now = reply
        return bool(int(acquired)), int(holders)

    async def capacity_release(self, endpoint_id: str, holder: str) -> bool:
        key = capacity_key(endpoint_id)
        reply = await self._call(
            lambda: self.scripts["capacity_release"](keys=[key], args=[holder])
        )
        return bool(int(reply))

    async def capacity_holders(self, endpoint_id: str) -> int:
        """Unexpired holders right now (diagnostics and tests).

        The acquire script with an empty holder and a limit of 0 takes nothing: it drops
        expired slots (Redis time) and reports the count, so no second script is needed.
        """
        key = capacity_key(endpoint_id)
        reply = await self._call(
            lambda: self.scripts["capacity_acquire"](keys=[key], args=["", 0, 0, "0"])
        )
        return int(reply[1])


def _write_reply(reply: Any) -> WriteReply:
    status, doc, revision, cancel, now = reply
    doc_bytes = _b(doc)
    return WriteReply(
        status=WriteStatus(_s(status)),
        stored=StoredBinding(
            doc=doc_bytes or None,
            revision=int(revision),
            cancel_requested=bool(int(cancel)),
            now_ms=int(now),
        ),
    )
