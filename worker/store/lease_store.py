"""Leases, fences and settled results: the store side of docs/architecture.md §4.

Every call here is one script on one slot. A call that fails ambiguously (timeout, lost
connection) is retried with the same owner token until it gets an answer or the deadline
passes: each script answers a repeat with what the first run did, so the retry *is* the
re-read, and nothing is decided on a guess. Calls on a pooled connection are shielded from
cancellation so a cancelled caller never leaves a half-read reply on it; script calls on
the shared connection need no shield (`Script.reasked`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from worker.errors import StoreNotAccepting, StoreUnavailable
from worker.store.health import StoreHealth, is_out_of_memory, is_refused
from worker.store.keys import ActionKeys
from worker.store.reask import reask
from worker.store.scripts import ScriptCall, Scripts, reply_text

T = TypeVar("T")

#: Longest wait for a new lease: an acquire is new work, which another worker can take.
ACQUIRE_BUDGET_S = 5.0


class AcquireStatus(StrEnum):
    ACQUIRED = "acquired"
    HELD = "held"
    SETTLED = "settled"
    #: The Action id was first delivered with a different request: nothing is acquired.
    COLLISION = "collision"


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    """The answer to an acquire: who holds the lease now, and at which fence."""

    status: AcquireStatus
    fence: int
    #: For ACQUIRED: the owner this one replaced ('' for a first delivery). For HELD: the holder.
    other_owner: str
    expires_at_ms: int
    #: The fence of an owner that recorded an unsafe provider request (0: none ever did).
    attempted_fence: int
    #: A durable cancel intent exists for the Action.
    cancel_requested: bool
    #: Redis time of the acquire (0 when the reply did not carry it).
    now_ms: int = 0
    #: Cancel intents were recorded before any worker knew the Action: authorize them.
    cancel_pending: bool = False
    #: The chunk-chain key this delivery registered with its fence ('' for none).
    chain_key: str = ""
    #: For ACQUIRED: the W3C traceparent the owner before this one recorded ('' for none):
    #: what a takeover's span links to (`worker.tracing`).
    previous_trace: str = ""

    @property
    def is_takeover(self) -> bool:
        return self.status is AcquireStatus.ACQUIRED and self.fence > 1


@dataclass(frozen=True, slots=True)
class Renewal:
    still_held: bool
    expires_at_ms: int
    cancel_requested: bool


class SettleStatus(StrEnum):
    SETTLED = "settled"
    EXISTS = "exists"
    FENCED_OUT = "fenced_out"


@dataclass(frozen=True, slots=True)
class SettleOutcome:
    status: SettleStatus
    #: The stored result (ours when SETTLED, the earlier one when EXISTS).
    stored: bytes | None
    #: The terminal chunk stored with it (None: stored by a version that kept none).
    terminal: bytes | None = None
    #: The chunks the bus refused while the Action ran, stored with it (None: none owed).
    owed: bytes | None = None


class CancelState(StrEnum):
    SETTLED = "settled"
    RECORDED = "recorded"
    ALREADY_REQUESTED = "already_requested"
    #: No worker has leased the Action yet: kept for the worker that does to authorize.
    PENDING = "pending"
    #: As PENDING, but the Action already has MAX_PENDING_CANCELS pending requesters.
    PENDING_FULL = "pending_full"
    #: The lease names another principal than the caller authorized against: nothing written.
    CHANGED = "changed"


#: Requesters whose cancel may wait for an Action no worker has leased yet.
MAX_PENDING_CANCELS = 16


@dataclass(frozen=True, slots=True)
class ActionSubject:
    """Whose Action a lease is for, recorded at acquisition so a cancel can be authorized."""

    principal_id: str
    tenant_id: str | None
    capability: str


@dataclass(frozen=True, slots=True)
class ChunkHead:
    """The last chunk of an Action's chain that its owner saw JetStream confirm."""

    seq: int
    #: sha256 (hex) of the chunk's exact bytes: the next chunk names it.
    sha256: str
    #: Its stream sequence (0: unknown): a takeover reads the subject from there on.
    stream_seq: int


@dataclass(frozen=True, slots=True)
class ChunkChainRecord:
    """What a takeover continues an Action's chunk chain from (`chunk_chain`)."""

    #: None when no owner recorded a confirmed chunk.
    head: ChunkHead | None
    #: fence → that delivery's chunk-chain key (hex), for every fence that had one.
    chain_keys: dict[int, str]


@dataclass(frozen=True, slots=True)
class CancelAnswer:
    state: CancelState
    #: The current lease holder ('' when none).
    owner: str
    #: The principal the lease records ('' when no worker has leased the Action).
    principal_id: str


def _b(value: Any) -> bytes:
    return value if isinstance(value, bytes) else reply_text(value).encode()


def _b_or_none(value: Any) -> bytes | None:
    return None if value is None else _b(value)


class LeaseStore:
    """Typed calls over the lease/result scripts of one Redis client."""

    def __init__(
        self,
        redis: Any,
        *,
        result_ttl_ms: int = 86_400_000,
        call_budget_s: float = 10.0,
        health: StoreHealth | None = None,
    ) -> None:
        self.redis = redis
        self.scripts = Scripts(redis)
        self.result_ttl_ms = result_ttl_ms
        # The lease hash outlives the result so the fence never restarts while a replay of
        # the Action could still be answered from the stored result.
        self.lease_key_ttl_ms = result_ttl_ms + 3_600_000
        self.call_budget_s = call_budget_s
        #: The fetch gate; when set, an acquire is refused at once while it is closed.
        self.health = health

    async def _call(self, fn: Callable[[], Awaitable[T]], budget_s: float | None = None) -> T:
        return await reask(fn, budget_s=self.call_budget_s if budget_s is None else budget_s)

    async def acquire(
        self,
        keys: ActionKeys,
        owner: str,
        ttl_ms: int,
        fingerprint: str,
        subject: ActionSubject | None = None,
        chain_key: str = "",
        traceparent: str = "",
    ) -> LeaseGrant:
        """Take the Action's lease. New work yields to the store's health: refused at once
        (`StoreNotAccepting`) while the gate is closed or Redis is at maxmemory, and given up
        at the first refused connection or after `ACQUIRE_BUDGET_S` (`StoreUnavailable`),
        instead of holding the delivery for the whole store budget. `subject` (the Action's
        verified principal, tenant and capability) is recorded with it for cancel
        authorization; `chain_key` is this delivery's chunk-chain key
        (`worker.execution.chunk_chain`), kept under the fence it is granted; `traceparent`
        this delivery's trace context, handed to the owner after it (`previous_trace`)."""
        recorded = subject or ActionSubject("", None, "")
        health = self.health
        if health is not None and not health.accepting:
            raise StoreNotAccepting(f"no new lease: {health.reason}")
        budget_s = min(self.call_budget_s, ACQUIRE_BUDGET_S)
        try:
            async with asyncio.timeout(budget_s):
                reply = await self.scripts["lease_acquire"].reasked(
                    [
                        keys.lease,
                        keys.result,
                        keys.cancel,
                        keys.cancel_pending,
                        keys.terminal,
                        keys.owed_chunks,
                    ],
                    [
                        owner,
                        ttl_ms,
                        self.lease_key_ttl_ms,
                        fingerprint,
                        recorded.principal_id,
                        recorded.tenant_id or "",
                        recorded.capability,
                        chain_key,
                        traceparent,
                    ],
                    budget_s=budget_s,
                    give_up_if=is_refused,
                )
        except TimeoutError:
            if health is not None:
                health.mark_failing("lease acquire got no answer")
            raise StoreUnavailable("redis did not answer a lease acquire in time") from None
        except StoreUnavailable as exc:
            if health is not None:
                health.mark_failing(str(exc))
            raise
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            if health is not None:
                health.mark_full("a lease acquire was refused: out of memory")
            raise StoreNotAccepting("redis is at maxmemory: no new lease") from None
        status, fence, other, expires, attempted, cancel = reply[:6]
        return LeaseGrant(
            status=AcquireStatus(reply_text(status)),
            fence=int(fence),
            other_owner=reply_text(other),
            expires_at_ms=int(expires),
            attempted_fence=int(attempted),
            cancel_requested=bool(cancel),
            now_ms=int(reply[6]) if len(reply) > 6 else 0,
            cancel_pending=bool(reply[7]) if len(reply) > 7 else False,
            chain_key=chain_key,
            previous_trace=reply_text(reply[8]) if len(reply) > 8 else "",
        )

    async def renew_many(
        self, leases: Sequence[tuple[ActionKeys, str, int]], ttl_ms: int, budget_s: float
    ) -> list[Renewal]:
        """Renew every held lease in one pipelined round trip (cost is O(1) round trips)."""
        if not leases:
            return []

        calls = [
            ScriptCall("lease_renew", [keys.lease, keys.cancel], [owner, fence, ttl_ms])
            for keys, owner, fence in leases
        ]
        # One pipeline: on Redis Cluster it is split into one round trip per master, sent
        # concurrently, so the cost stays O(masters) whatever the number of leases.
        replies = await self._call(lambda: self.scripts.pipeline(calls), budget_s)
        return [
            Renewal(still_held=int(r[0]) > 0, expires_at_ms=int(r[0]), cancel_requested=bool(r[1]))
            for r in replies
        ]

    async def release(self, keys: ActionKeys, owner: str, fence: int) -> bool:
        reply = await self.scripts["lease_release"].reasked(
            [keys.lease], [owner, fence], budget_s=self.call_budget_s
        )
        return bool(reply)

    async def mark_attempt(self, keys: ActionKeys, owner: str, fence: int) -> bool:
        """Record that this fence is about to send an unsafe request; False: send nothing."""
        reply = await self.scripts["mark_attempt"].reasked(
            [keys.lease], [owner, fence], budget_s=self.call_budget_s
        )
        return bool(reply)

    async def record_chunk_head(
        self, keys: ActionKeys, owner: str, fence: int, head: ChunkHead
    ) -> bool:
        """Record `head` as the chain's last confirmed chunk (`lua/chunk_record.lua`); False:
        the caller no longer holds the lease."""
        reply = await self.scripts["chunk_record"].reasked(
            [keys.lease],
            [owner, fence, head.seq, head.sha256, head.stream_seq],
            budget_s=self.call_budget_s,
        )
        return bool(reply)

    async def chunk_chain(self, keys: ActionKeys) -> ChunkChainRecord:
        """The recorded head of the Action's chunk chain and every fence's chain key."""
        reply = await self.scripts["chunk_chain"].reasked(
            [keys.lease], [], budget_s=self.call_budget_s
        )
        seq, sha, stream_seq = int(reply[0]), reply_text(reply[1]), int(reply[2])
        chain_keys = {int(reply[i]): reply_text(reply[i + 1]) for i in range(3, len(reply) - 1, 2)}
        head = ChunkHead(seq, sha, stream_seq) if seq >= 0 and sha else None
        return ChunkChainRecord(head, chain_keys)

    async def settle(
        self,
        keys: ActionKeys,
        owner: str,
        fence: int,
        result_json: bytes,
        terminal_json: bytes | None,
        owed_json: bytes | None = b"",
        *,
        refused: bool = False,
    ) -> SettleOutcome:
        """Store the result and the terminal chunk closing the Action's stream (with the
        chunks the bus refused on the way, `owed_json`), together, write-once, iff `owner`
        still holds the lease at `fence` (`lua/settle.lua`). `terminal_json` None: the
        result of a non-streaming capability, which has no chunk stream. `refused`: a
        refusal nothing was attempted for, which another request (another fingerprint) may
        still replace (`lua/lease_acquire.lua`)."""
        reply = await self.scripts["settle"].reasked(
            [keys.lease, keys.result, keys.terminal, keys.owed_chunks],
            [
                owner,
                fence,
                result_json,
                self.result_ttl_ms,
                terminal_json or b"",
                owed_json or b"",
                "1" if refused else "0",
            ],
            budget_s=self.call_budget_s,
        )
        status, stored, terminal, owed = reply
        return SettleOutcome(
            SettleStatus(reply_text(status)),
            _b(stored) or None,
            _b(terminal) or None,
            _b(owed) or None,
        )

    async def get_settled(
        self, keys: ActionKeys
    ) -> tuple[bytes | None, bytes | None, bytes | None]:
        """The stored result, its terminal chunk and the chunks owed before it (one slot:
        one MGET)."""
        result, terminal, owed = await self._call(
            lambda: self.redis.mget([keys.result, keys.terminal, keys.owed_chunks])
        )
        return _b_or_none(result), _b_or_none(terminal), _b_or_none(owed)

    async def cancel_subject(self, keys: ActionKeys) -> ActionSubject | None:
        """Whose Action this is, as its lease recorded it; None before any worker leased it."""
        principal, tenant, capability = await self._call(
            lambda: self.redis.hmget(keys.lease, ["principal", "tenant", "capability"])
        )
        if not principal:
            return None
        return ActionSubject(
            reply_text(principal),
            reply_text(tenant) if tenant else None,
            reply_text(capability or ""),
        )

    async def request_cancel(
        self, keys: ActionKeys, intent_json: bytes, *, requested_by: str, authorized_for: str
    ) -> CancelAnswer:
        """Record an intent the caller authorized against principal `authorized_for` (''
        when `cancel_subject` found no lease); see cancel_request.lua for the answers."""
        reply = await self._call(
            lambda: self.scripts["cancel_request"](
                keys=[keys.cancel, keys.result, keys.lease, keys.cancel_pending],
                args=[
                    intent_json,
                    self.lease_key_ttl_ms,
                    requested_by,
                    authorized_for,
                    MAX_PENDING_CANCELS,
                ],
            )
        )
        state, owner, principal = reply
        return CancelAnswer(
            CancelState(reply_text(state)), reply_text(owner), reply_text(principal)
        )

    async def pending_cancels(self, keys: ActionKeys) -> dict[str, bytes]:
        """Intents recorded before the Action was leased, by requester."""
        raw = await self._call(lambda: self.redis.hgetall(keys.cancel_pending))
        return {
            reply_text(k): v if isinstance(v, bytes) else reply_text(v).encode()
            for k, v in raw.items()
        }

    async def promote_cancel(self, keys: ActionKeys, intent_json: bytes | None) -> bool:
        """Make an authorized pending intent durable (None: none was) and drop the rest;
        True when a durable intent exists afterwards."""
        reply = await self._call(
            lambda: self.scripts["cancel_promote"](
                keys=[keys.cancel, keys.cancel_pending],
                args=[intent_json or b"", self.lease_key_ttl_ms],
            )
        )
        return bool(int(reply))

    async def remember_resume(self, keys: ActionKeys) -> None:
        """Record where a resume Action's keys live, so a cancel naming it finds them."""
        await self._call(
            lambda: self.redis.set(keys.resume_alias, keys.slot_action_id, px=self.lease_key_ttl_ms)
        )

    async def keys_of(self, action_id: str) -> ActionKeys:
        """The keys of an Action known only by id (a resume's live under its source)."""
        source = await self._call(lambda: self.redis.get(ActionKeys.of(action_id).resume_alias))
        if source is None:
            return ActionKeys.of(action_id)
        return ActionKeys.of(action_id, source_action_id=reply_text(source))

    async def cancel_intent(self, keys: ActionKeys) -> bytes | None:
        value = await self._call(lambda: self.redis.get(keys.cancel))
        return value if value is None or isinstance(value, bytes) else reply_text(value).encode()

    async def cancel_requested_many(
        self, keys: Sequence[ActionKeys], *, budget_s: float
    ) -> list[bool]:
        """Whether a durable cancel intent exists for each Action: one pipelined round trip."""
        if not keys:
            return []

        async def read() -> list[Any]:
            pipe = self.redis.pipeline(transaction=False)
            for k in keys:
                pipe.exists(k.cancel)
            return list(await pipe.execute())

        return [bool(int(found)) for found in await self._call(read, budget_s)]

    async def lease_view(self, keys: ActionKeys) -> dict[str, str]:
        raw = await self._call(lambda: self.redis.hgetall(keys.lease))
        return {reply_text(k): reply_text(v) for k, v in raw.items()}
