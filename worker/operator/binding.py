"""The durable OperatorBinding: its states, its transition table and its records.

The binding is the AIP side of a volatile Hermes run (spec "Understand the durable binding"):
it fences the non-idempotent start, remembers which run belongs to which Action, retains
event progress and approval commands, and replays a terminal result without contacting
Hermes again. Every change is a pure function returning a new binding; only the transition
table decides which state may follow which, and terminal states have no way out.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import msgspec

from schemas.action import Action
from schemas.errors import ErrorCode
from schemas.operator import OperatorStatus
from worker.errors import ConnectorError, IllegalTransition

#: The profile-state namespace of the spec; the Redis key prefix mirrors it
#: (docs/architecture.md §5).
NAMESPACE = "aip.connector.hermes_agent.operator_runs.v1"
#: The approval command ledger keeps at most this many commands per source run.
MAX_APPROVAL_COMMANDS = 256


#: The binding's state is the status the operator output publishes (spec "Follow the
#: operator states"): one enum, so the two can never drift apart.
BindingState = OperatorStatus


S = BindingState

TERMINAL_STATES = frozenset({S.COMPLETED, S.FAILED, S.CANCELLED, S.OUTCOME_UNKNOWN})

#: Every allowed move. A provider terminal event can arrive in any live state (a run can end
#: by itself while we wait, or be stopped through `run_stop`), so every live state may reach
#: every terminal one; the live states otherwise follow the lifecycle of the spec.
TRANSITIONS: dict[BindingState, frozenset[BindingState]] = {
    S.STARTING: frozenset({S.RUNNING, S.CANCELLING} | TERMINAL_STATES),
    S.RUNNING: frozenset({S.WAITING_FOR_APPROVAL, S.CANCELLING} | TERMINAL_STATES),
    S.WAITING_FOR_APPROVAL: frozenset({S.RUNNING, S.CANCELLING} | TERMINAL_STATES),
    # Cancellation intent is never withdrawn: only a terminal state follows.
    S.CANCELLING: TERMINAL_STATES,
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.OUTCOME_UNKNOWN: frozenset(),
}


class CommandState(StrEnum):
    CLAIMED = "claimed"
    APPLIED = "applied"
    REJECTED = "rejected"
    OUTCOME_UNKNOWN = "outcome_unknown"


COMMAND_TRANSITIONS: dict[CommandState, frozenset[CommandState]] = {
    CommandState.CLAIMED: frozenset(
        {CommandState.APPLIED, CommandState.REJECTED, CommandState.OUTCOME_UNKNOWN}
    ),
    CommandState.APPLIED: frozenset(),
    CommandState.REJECTED: frozenset(),
    CommandState.OUTCOME_UNKNOWN: frozenset(),
}


class _Record(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of the stored records: immutable, strict, keyword-only."""


class StartClaim(_Record, frozen=True, omit_defaults=True):
    """The exclusive right to send `POST /v1/runs` once (spec "Fence provider start").

    The two keyed fields are set only when the endpoint advertised durable run idempotency
    (`worker/hermes/features.py`) at claim time, and left out of the stored JSON otherwise,
    so a claim against Hermes 0.19 is stored exactly as before."""

    claim_id: str
    #: The connector instance (worker id) that owns the claim.
    instance_id: str
    #: The lease owner token and fence of the claiming delivery: a higher fence on the
    #: Action's lease proves the claimant can no longer bind anything.
    owner: str
    fence: int
    acquired_at_ms: int
    expires_at_ms: int
    #: The `Idempotency-Key` the start is sent with (derived from the Action, never from a
    #: secret), so a later holder can re-send the same request and learn the run.
    idempotency_key: str | None = None
    #: sha256 of the exact start body: a re-send must be byte-identical, or it is not sent.
    request_sha256: str | None = None


class ProviderSnapshot(_Record, frozen=True):
    """What `GET /v1/runs/{id}` said at one moment, to tell a stale prompt from a new one."""

    status: str
    last_event: str | None = None
    updated_at: float | None = None


class ApprovalCommand(_Record, frozen=True, omit_defaults=True):
    """One resume decision, recorded before Hermes is contacted (spec "Resume a provider
    approval"). Defaults are left out of the stored JSON, so a command against Hermes 0.19
    (no `request_id`) is stored exactly as before."""

    resume_action_id: str
    fingerprint: str
    generation: int
    choice: str
    resolve_all: bool
    state: CommandState
    #: Unique per invocation: the one that may send this decision.
    claim_id: str
    owner: str
    fence: int
    instance_id: str
    claimed_at_ms: int
    expires_at_ms: int
    updated_at_ms: int
    remote_status: int | None = None
    #: The run status just before the decision was sent (stale-prompt detection on replay).
    baseline: ProviderSnapshot | None = None
    #: The prompt's own id (Hermes after 0.19 sends `request_id` with `approval.request`):
    #: sent with the decision, so it answers that prompt and no other.
    request_id: str | None = None

    def moved(self, state: CommandState, now_ms: int, **changes: Any) -> ApprovalCommand:
        if state not in COMMAND_TRANSITIONS[self.state]:
            raise IllegalTransition(f"approval command {self.state} -> {state}")
        return msgspec.structs.replace(self, state=state, updated_at_ms=now_ms, **changes)


class BindingError(_Record, frozen=True):
    """The typed failure a terminal binding replays (no provider body, no secret)."""

    code: ErrorCode
    message: str
    remote_status: int | None = None
    retryable: bool | None = None
    uncertain_outcome: bool | None = None

    @classmethod
    def of(cls, error: ConnectorError) -> BindingError:
        return cls(
            code=error.code,
            message=error.message,
            remote_status=error.remote_status,
            retryable=error._retryable,
            uncertain_outcome=error._uncertain,
        )

    def to_error(self) -> ConnectorError:
        return ConnectorError(
            self.code,
            self.message,
            remote_status=self.remote_status,
            retryable=self.retryable,
            uncertain_outcome=self.uncertain_outcome,
        )


class OperatorBinding(_Record, frozen=True):
    """Every field of the spec's binding table, plus `revision` (docs/architecture.md §5)."""

    action_id: str
    request_fingerprint: str
    endpoint_id: str
    session_id: str
    status: BindingState
    created_at: int
    updated_at: int
    revision: int = 1
    run_id: str | None = None
    start_claim: StartClaim | None = None
    delegation_id: str | None = None
    parent_action_id: str | None = None
    cancel_requested: bool = False
    last_event: str | None = None
    next_sequence: int = 0
    approval_generation: int = 0
    approval_commands: list[ApprovalCommand] = msgspec.field(default_factory=list)
    pending_approval: dict[str, Any] | None = None
    #: Provider evidence of the terminal run (`{"event", "output", …}`), redacted.
    output: dict[str, Any] | None = None
    error: BindingError | None = None
    #: The verified principal and tenant of the Action that started the run (admitted by
    #: the trust gate). None only in a binding an older worker wrote: the source's lease
    #: then says whose run it is (`worker.trust.resume_authority`).
    principal_id: str | None = None
    tenant_id: str | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATES

    def moved(self, state: BindingState, now_ms: int, **changes: Any) -> OperatorBinding:
        """The binding in `state`; raises IllegalTransition when the table forbids it."""
        if state is not self.status and state not in TRANSITIONS[self.status]:
            raise IllegalTransition(f"binding {self.status} -> {state}")
        if self.terminal:
            raise IllegalTransition(f"binding {self.status} is terminal and write-once")
        return msgspec.structs.replace(self, status=state, updated_at=now_ms, **changes)

    def changed(self, now_ms: int, **changes: Any) -> OperatorBinding:
        """Same state, other fields (progress, ledger); still refused once terminal."""
        return self.moved(self.status, now_ms, **changes)

    def ended(
        self,
        state: BindingState,
        now_ms: int,
        *,
        error: ConnectorError | None = None,
        **changes: Any,
    ) -> OperatorBinding:
        """A terminal state with its evidence; the start claim and the prompt are cleared.

        `error` is what a replay of this binding returns as the Action's error.
        """
        if state not in TERMINAL_STATES:
            raise IllegalTransition(f"{state} is not terminal")
        return self.moved(
            state,
            now_ms,
            error=None if error is None else BindingError.of(error),
            start_claim=None,
            pending_approval=None,
            **changes,
        )

    def command_for(self, resume_action_id: str) -> ApprovalCommand | None:
        for command in self.approval_commands:
            if command.resume_action_id == resume_action_id:
                return command
        return None

    def with_command(self, command: ApprovalCommand, now_ms: int) -> OperatorBinding:
        """The ledger with `command` added or replaced (matched by resume Action id)."""
        commands = [
            c for c in self.approval_commands if c.resume_action_id != command.resume_action_id
        ]
        commands.append(command)
        return self.changed(now_ms, approval_commands=commands)


_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder(OperatorBinding)


def encode_binding(binding: OperatorBinding) -> bytes:
    return _encoder.encode(binding)


def decode_binding(data: bytes) -> OperatorBinding:
    """Parse a stored binding; a corrupt record is an `operator_state` failure, not a guess."""
    try:
        return _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConnectorError(
            ErrorCode.OPERATOR_STATE, f"stored operator binding does not parse: {exc}"
        ) from None


def session_id_for(action_id: str, partition_prefix: str = "") -> str:
    """The stable Hermes session of an operator Action (spec "Submit a direct objective");
    on a shared endpoint inside the Action's tenant partition
    (`worker.operations.partition.prefix_of`)."""
    return f"{partition_prefix}aip-operator-{action_id}"


def new_binding(
    action: Action, endpoint_id: str, fingerprint: str, now_ms: int, *, partition_prefix: str = ""
) -> OperatorBinding:
    """A fresh binding, recording who started the run: a resume must come from that
    principal or an authority member of its tenant (`worker.trust.resume_authority`)."""
    delegation = action.delegation
    return OperatorBinding(
        action_id=action.id,
        request_fingerprint=fingerprint,
        endpoint_id=endpoint_id,
        session_id=session_id_for(action.id, partition_prefix),
        principal_id=action.identity.principal_id,
        tenant_id=action.identity.tenant_id,
        status=BindingState.STARTING,
        created_at=now_ms,
        updated_at=now_ms,
        delegation_id=None if delegation is None else delegation.delegation_id,
        parent_action_id=None if delegation is None else delegation.parent_action_id,
    )


def collision_error() -> ConnectorError:
    return ConnectorError(
        ErrorCode.OPERATOR_POLICY,
        "idempotency collision: this Action id is bound to a different endpoint, input or "
        "delegation request",
    )
