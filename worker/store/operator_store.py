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
the first run did), calls on a pooled connection are shielded from cancellation (script
calls on the shared one need no shield: `Script.reasked`), and a budget bounds the retries.

Write confirmation (when the client carries a `WriteConfirmation`, see `connection.py`):
Redis replicates asynchronously, so a failover can promote a replica that never received an
acknowledged write. Binding writes are therefore followed by WAIT (WAITAOF from Redis 7.2)
on the same connection, in the same pipeline, on the node that owns the slot:

* a write that leaves the binding `starting` (the create, the start claim, its renewal)
  must be confirmed before the caller may act on it: it is re-sent with its confirmation
  until replicas acknowledge it or the budget ends, then `StoreUnavailable` is raised and
  `POST /v1/runs` is never sent on a claim a failover could forget;
* any other binding write (the bound run id, terminal states) is confirmed once and a
  shortfall only logged: the run exists whatever Redis remembers, and a write lost in a
  failover is seen by the next owner as an unbound claim, which settles an honest
  `outcome_unknown` instead of starting a second run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from worker.errors import SlotMoved, StoreUnavailable
from worker.store.connection import WriteConfirmation, is_transient, write_confirmation
from worker.store.keys import ActionKeys, capacity_key
from worker.store.reask import reask
from worker.store.scripts import ScriptCall, Scripts, reply_text

T = TypeVar("T")
log = logging.getLogger(__name__)

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


#: The binding state whose writes must be confirmed before the caller acts on them.
_MUST_CONFIRM_STATE = "starting"
#: The first server version with WAITAOF (Valkey 7.2 reports the same `redis_version`).
_WAITAOF_SINCE = (7, 2)


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


def _retriable(exc: BaseException) -> bool:
    return is_transient(exc) or isinstance(exc, SlotMoved)


class OperatorStore:
    """Typed calls over the operator and capacity scripts of one Redis client."""

    def __init__(
        self,
        redis: Any,
        *,
        binding_ttl_ms: int = DEFAULT_BINDING_TTL_MS,
        call_budget_s: float = 10.0,
        confirm: WriteConfirmation | None = None,
    ) -> None:
        self.redis = redis
        self.scripts = Scripts(redis, names=OPERATOR_SCRIPTS)
        self.binding_ttl_ms = binding_ttl_ms
        self.call_budget_s = call_budget_s
        self.confirm = confirm if confirm is not None else write_confirmation(redis)
        #: Learned from the server on the first confirmed write (None: not asked yet).
        self._has_waitaof: bool | None = None
        #: Writes that were not confirmed in time (diagnostics and tests).
        self.unconfirmed_writes = 0

    @classmethod
    def reader(cls, redis: Any) -> OperatorStore:
        """A store that only reads bindings, for a Redis user holding them read-only (the
        approver's, `compose/redis/users.acl`): its read goes as EVALSHA_RO, which such a
        user may send, where EVALSHA counts every key it names as written."""
        store = cls(redis)
        store.scripts = Scripts(
            redis, names=("operator_read",), read_only=frozenset({"operator_read"})
        )
        return store

    async def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        return await reask(fn, budget_s=self.call_budget_s, retry_if=_retriable)

    async def _script(self, name: str, keys: Sequence[Any], args: Sequence[Any] = ()) -> Any:
        """One script re-asked with this store's budget and retry rule (`Script.reasked`)."""
        return await self.scripts[name].reasked(
            keys, args, budget_s=self.call_budget_s, retry_if=_retriable
        )

    # --- bindings --------------------------------------------------------------------------

    async def read(self, binding_key: str) -> StoredBinding:
        reply = await self._script("operator_read", [binding_key])
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
        call = ScriptCall(
            "operator_create",
            [keys.binding, keys.lease],
            [owner, fence, doc, state, self.binding_ttl_ms],
        )
        return _write_reply(await self._write(call, must_confirm=state == _MUST_CONFIRM_STATE))

    async def write(
        self,
        keys: ActionKeys,
        owner: str,
        fence: int,
        expected_revision: int,
        doc: bytes,
        state: str,
    ) -> WriteReply:
        call = ScriptCall(
            "operator_write",
            [keys.binding, keys.lease],
            [owner, fence, expected_revision, doc, state, self.binding_ttl_ms],
        )
        return _write_reply(await self._write(call, must_confirm=state == _MUST_CONFIRM_STATE))

    async def mark_cancel(self, binding_key: str) -> tuple[MarkStatus, str]:
        reply = await self._script("operator_mark_cancel", [binding_key])
        status, state = reply
        return MarkStatus(reply_text(status)), reply_text(state)

    async def record_reconciliation(
        self, binding_key: str, decision: bytes
    ) -> tuple[ReconcileStatus, bytes]:
        reply = await self._script("operator_reconcile", [binding_key], [decision])
        status, stored = reply
        return ReconcileStatus(reply_text(status)), _b(stored)

    # --- write confirmation ---------------------------------------------------------------

    async def _write(self, call: ScriptCall, *, must_confirm: bool) -> Any:
        """Run a binding write; with a confirmation policy, wait for replicas (module doc)."""
        confirm = self.confirm
        if confirm is None:
            return await self._script(call.name, call.keys, call.args)
        deadline = time.monotonic() + self.call_budget_s
        own: Any = None
        while True:
            reply, confirmed = await self._call(lambda: self._write_and_wait(call, confirm))
            reply = _as_own_repeat(reply, own)
            if confirmed or reply_text(reply[0]) not in (WriteStatus.CREATED, WriteStatus.WRITTEN):
                return reply
            own = reply
            self.unconfirmed_writes += 1
            if not must_confirm:
                log.warning(
                    "binding write not confirmed by %d replica(s) in %d ms; a failover now "
                    "could forget it (the next owner would settle outcome_unknown)",
                    confirm.replicas,
                    confirm.timeout_ms,
                )
                return reply
            if time.monotonic() >= deadline:
                raise StoreUnavailable(
                    f"the start claim was not confirmed by {confirm.replicas} replica(s); "
                    "nothing is sent on a claim a failover could forget"
                )

    async def _write_and_wait(
        self, call: ScriptCall, confirm: WriteConfirmation
    ) -> tuple[Any, bool]:
        """The write and its WAIT in one pipeline: WAIT only covers writes made earlier on
        its own connection, and a pipeline keeps both on one connection to one node.

        A repeat of a write that already happened is harmless and still confirms it: the
        scripts' idempotent branches touch the key's TTL, which is replicated, so the
        connection's replication offset covers the original write too.
        """
        cluster = isinstance(self.redis, RedisCluster)
        node: Any = None
        if cluster:
            await self.redis.initialize()
            node = self.redis.get_node_from_key(call.keys[0])
        command = await self._wait_command(confirm, node)
        target: dict[str, Any] = {"target_nodes": node} if cluster else {}
        try:
            reply, acks = await self.scripts.pipeline(
                [call], lambda pipe: pipe.execute_command(*command, **target)
            )
        except ResponseError as exc:
            if cluster and "replica" in str(exc):
                # The node became a replica (failover): the write went to the new master by
                # redirection but the WAIT did not follow it. Send the pair again.
                raise SlotMoved(call.keys[0]) from None
            raise
        if cluster and self.redis.get_node_from_key(call.keys[0]).name != node.name:
            # The write was redirected (MOVED) to a new owner: the WAIT ran on the old one.
            return reply, False
        if command[0] == "WAITAOF":
            local, replicas = (int(n) for n in acks)
            return reply, local >= 1 and replicas >= confirm.replicas
        return reply, int(acks) >= confirm.replicas

    async def _wait_command(self, confirm: WriteConfirmation, node: Any) -> tuple[Any, ...]:
        """WAITAOF 1 N (the master's AOF fsync and N replicas') where the server has it,
        else WAIT N (N replicas hold the write in memory)."""
        if self._has_waitaof is None:
            target: dict[str, Any] = {} if node is None else {"target_nodes": node}
            info = await self._call(lambda: self.redis.execute_command("INFO", "server", **target))
            version = tuple(int(p) for p in str(info.get("redis_version", "0")).split(".")[:2])
            self._has_waitaof = version >= _WAITAOF_SINCE
        if self._has_waitaof:
            return ("WAITAOF", 1, confirm.replicas, confirm.timeout_ms)
        return ("WAIT", confirm.replicas, confirm.timeout_ms)

    # --- endpoint capacity -----------------------------------------------------------------

    async def capacity_acquire(
        self, endpoint_id: str, holder: str, limit: int, ttl_ms: int, *, force: bool = False
    ) -> tuple[bool, int]:
        """Take (or refresh) the holder's slot; (acquired, holders now)."""
        key = capacity_key(endpoint_id)
        reply = await self._script(
            "capacity_acquire", [key], [holder, limit, ttl_ms, "1" if force else "0"]
        )
        acquired, holders, _now = reply
        return bool(int(acquired)), int(holders)

    async def capacity_release(self, endpoint_id: str, holder: str) -> bool:
        key = capacity_key(endpoint_id)
        reply = await self._script("capacity_release", [key], [holder])
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


def _as_own_repeat(reply: Any, own: Any) -> Any:
    """A re-sent create (its first run was not confirmed) meets the binding that first run
    stored and answers `exists`; that binding is the caller's own, so the answer is the
    first run's `created`, with the repeat's stored binding and Redis time. Without this a
    slow replica made a start claim read as somebody else's binding."""
    if (
        own is None
        or reply_text(own[0]) != WriteStatus.CREATED
        or reply_text(reply[0]) != WriteStatus.EXISTS
        or _b(reply[1]) != _b(own[1])
    ):
        return reply
    return [own[0], *reply[1:]]


def _write_reply(reply: Any) -> WriteReply:
    status, doc, revision, cancel, now = reply
    doc_bytes = _b(doc)
    return WriteReply(
        status=WriteStatus(reply_text(status)),
        stored=StoredBinding(
            doc=doc_bytes or None,
            revision=int(revision),
            cancel_requested=bool(int(cancel)),
            now_ms=int(now),
        ),
    )
