"""What an operation is, and what it may ask of the runtime while it executes.

An operation is one capability (`cap:hermes_agent:{endpoint}:{name}`): a spec that the
manifest publishes and an `execute` that talks to Hermes. It never touches leases, acks or
result publication: the runtime owns those (docs/architecture.md §4). It reports progress with
`ctx.emit(...)` and returns an `Outcome`, or raises `ConnectorError`.

Everything the runtime must know about one operation in particular is asked through this
protocol, so the pipeline imports no operation's code: where an Action's state lives
(`keys`), whether an earlier delivery already began its work (`began`), and which code an
Action id reused with another request is refused with (`collision_code`). `Stateless` gives
the answers of an operation that keeps no state of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from schemas.action import Action, Mode
from schemas.chunk import ChunkKind
from schemas.errors import ErrorCode
from schemas.manifest import OperationContract, Risk
from schemas.result import ResultStatus
from worker.endpoints import Endpoint
from worker.errors import ConnectorError
from worker.execution.cancel_signal import CancelSignal
from worker.hermes.http_client import HermesClient
from worker.store.keys import ActionKeys

if TYPE_CHECKING:
    from worker.store.stores import Stores


@dataclass(frozen=True, slots=True)
class OperationSpec:
    """The facts of one operation the runtime enforces and the manifest publishes
    (`worker.wire.manifests.capability_of`; docs/architecture.md §7)."""

    name: str
    method: str
    route: str
    read_only: bool
    risk: Risk
    approval_required: bool
    idempotency_required: bool
    streaming: bool
    timeout_ms: int
    #: The msgspec type `Action.input` is validated against (its JSON Schema is published).
    input_type: type[Any]
    description: str = ""
    #: The whole operation contract, for a capability whose spec publishes one; its
    #: `principal` may name `{endpoint}`.
    contract: OperationContract | None = None
    #: A `*_stream` twin (`chat_stream`, `responses_stream`, `session_chat_stream`): it
    #: answers `stream` Actions only, as the reference connector's streaming twins do.
    stream_only: bool = False

    @property
    def modes(self) -> tuple[Mode, ...]:
        """The `Action.mode`s offered: `stream` only where the capability streams, and only
        `stream` for a streaming twin (its sync sibling never streams)."""
        if self.stream_only:
            return (Mode.STREAM,)
        if self.streaming:
            return (Mode.SYNC, Mode.ASYNC, Mode.STREAM)
        return (Mode.SYNC, Mode.ASYNC)



@dataclass(slots=True)
class Outcome:
    """What an execution ended with; the runtime turns it into the settled ActionResult."""

    status: ResultStatus
    output: Any = None
    error: ConnectorError | None = None


#: What a recovering redelivery may spend observing what exists when the Action's own
#: deadline has already passed (it never starts anything new).
RECOVERY_BUDGET_MS = 10_000


@dataclass(frozen=True, slots=True)
class Recovering:
    """The params of a redelivery that admission refused although an earlier delivery had
    already begun the work (its binding exists): the deadline passed, an approval expired, a
    credential was rotated. A self-fenced operation may observe, stop and settle what
    exists, but must not start anything new; `error` is why not."""

    params: Any
    error: ConnectorError

    @staticmethod
    def unwrap(params: Any) -> tuple[Any, ConnectorError | None]:
        """(the operation's own params, why no start may be sent or None)."""
        if isinstance(params, Recovering):
            return params.params, params.error
        return params, None


class ExecutionContext(Protocol):
    """What the runtime gives an executing operation (implemented in `worker.execution.context`)."""

    action: Action
    endpoint: Endpoint
    hermes: HermesClient
    worker_id: str
    #: Set when a cancel intent for this Action is durable (operations that handle
    #: cancellation themselves watch it; others are cancelled by the runtime).
    cancel_requested: CancelSignal
    #: The worker's stores (leases, operator state, approvals, the Redis clock).
    stores: Stores

    @property
    def keys(self) -> ActionKeys: ...

    @property
    def owner(self) -> str:
        """Unique per delivery attempt; the lease owner token."""
        ...

    @property
    def fence(self) -> int: ...

    @property
    def is_takeover(self) -> bool:
        """True when this delivery took the Action over from an earlier owner."""
        ...

    @property
    def leased_at_ms(self) -> int:
        """Redis time of this delivery's lease acquire (0: unknown)."""
        ...

    @property
    def attempted_fence(self) -> int:
        """Fence of an earlier owner that recorded sending an unsafe request (0: none)."""
        ...

    @property
    def next_seq(self) -> int: ...

    def deadline_unix_ms(self) -> int: ...

    def remaining_s(self) -> float: ...

    def trusted_headers(self) -> Mapping[str, str]: ...

    async def emit(
        self,
        kind: ChunkKind,
        payload: Any = None,
        *,
        provider_event: str | None = None,
        run_id: str | None = None,
    ) -> int:
        """Publish the next chunk (its seq is returned); raises ConnectorError on failure,
        `worker.errors.LeaseLost` when the lease may have passed to another worker. A
        terminal kind (`done`, `error`) is published after the settle, and only the first
        one counts."""
        ...

    async def mark_unsafe_attempt(self) -> None:
        """Record that this fence sends an unsafe request now; raises `LeaseLost` if
        fenced out."""
        ...


class Operation(Protocol):
    spec: OperationSpec
    #: True when the operation reconciles cancellation itself (the operator); otherwise the
    #: runtime cancels the execution task and settles `cancelled`.
    handles_cancel: ClassVar[bool]
    #: True when the operation fences its own unsafe provider calls (the operator's start
    #: claim). Otherwise, for an unsafe operation the runtime records the attempt before
    #: `execute`, and settles an uncertain failure instead of executing when an earlier owner
    #: had recorded one.
    self_fenced: ClassVar[bool]
    #: The code an Action id first used with another request is dead-lettered with.
    collision_code: ClassVar[ErrorCode]

    def keys(self, action: Action) -> ActionKeys:
        """Where `action`'s lease, result and state live (docs/architecture.md §5); read
        from the raw input, before it is validated."""
        ...

    async def began(self, stores: Stores, keys: ActionKeys) -> bool:
        """True when an earlier delivery already began this work (got past admission and
        left state behind): a refused redelivery then recovers what exists instead of
        settling a refusal (see `Recovering`)."""
        ...

    async def execute(self, ctx: ExecutionContext, params: Any) -> Outcome: ...


class Stateless:
    """The protocol's answers for an operation that keeps no state of its own: its keys
    are its Action's, nothing of it exists before its lease, the runtime fences and cancels
    it, and a reused Action id is an input error."""

    handles_cancel: ClassVar[bool] = False
    self_fenced: ClassVar[bool] = False
    collision_code: ClassVar[ErrorCode] = ErrorCode.CONFIGURATION_OR_INPUT

    def keys(self, action: Action) -> ActionKeys:
        return ActionKeys.of(action.id)

    async def began(self, stores: Stores, keys: ActionKeys) -> bool:
        return False


@dataclass(slots=True)
class Registry:
    """Operations by name; the manifest and the dispatcher read the same table."""

    operations: dict[str, Operation] = field(default_factory=dict)

    def add(self, operation: Operation) -> None:
        name = operation.spec.name
        if name in self.operations:
            raise ValueError(f"operation {name!r} registered twice")
        self.operations[name] = operation

    def get(self, name: str) -> Operation | None:
        return self.operations.get(name)

