"""ProtocolError, the table of every error code a worker may emit, and the wire layer's
exceptions.

Codes, categories and retry/uncertainty rules come from the connector's troubleshooting
runbook (`connector.hermes_agent.*`) plus the envelope and host codes it names. The table is
data so that the wire schema, the docs and the runtime read the same facts.

Every other exception is in `worker/errors.py`; these are here, under their own root,
because `schemas/` and `subjects/` sit below `worker/` and import nothing from it:

    Exception
      WireError              the wire layer's root
        EnvelopeRejected     an envelope the workers dead-letter (`code` names why): not
                             retryable, not uncertain; nothing of it ran
        InvalidEndpointId    an endpoint id outside the subject grammar: refused at start-up;
                             a ValueError too
        BodyError            an AIP Envelope body that is not exactly one payload of its
                             message type (`schemas.aip.messages.open_body`); a ValueError too
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

import msgspec

from schemas._base import WireStruct


class ErrorCategory(StrEnum):
    PERMANENT = "permanent"
    AUTH = "auth"
    TEMPORARY = "temporary"
    TRANSPORT = "transport"
    CONNECTOR = "connector"
    POLICY = "policy"


class Retry(StrEnum):
    """When an error may be retried automatically."""

    NEVER = "never"
    #: Only when the failed capability is read-only (troubleshooting: "read-only conditional").
    READ_ONLY = "read_only"
    ALWAYS = "always"


class Uncertainty(StrEnum):
    """When an error means the provider may have acted anyway."""

    NEVER = "never"
    #: When the failed capability is unsafe (a mutation may have happened).
    UNSAFE = "unsafe"
    ALWAYS = "always"


class ErrorCode(StrEnum):
    # Envelope and host layer.
    SCHEMA_ENVELOPE_INVALID = "schema.envelope.invalid"
    ENVELOPE_DECODE_INVALID = "envelope.decode.invalid"
    HOST_AUTHENTICATION = "connector_host.authentication"
    HOST_REPLAY = "connector_host.replay"
    HOST_ROUTE_MISMATCH = "connector_host.route_mismatch"
    HOST_CREDENTIAL_REVISION_DENIED = "connector_host.credential_revision_denied"
    HOST_APPROVAL_AUTHORIZATION_CONFLICT = "connector_host.approval_authorization_conflict"
    HOST_APPROVAL_AUTHORIZATION_UNAVAILABLE = "connector_host.approval_authorization_unavailable"
    HOST_NOT_READY = "connector_host.not_ready"
    HOST_CAPACITY = "connector_host.capacity"
    HOST_EXECUTION = "connector_host.execution"
    HOST_RESPONSE_SIGNING = "connector_host.response_signing"
    # Base connector codes.
    CONFIGURATION_OR_INPUT = "connector.hermes_agent.configuration_or_input"
    TENANT_MISMATCH = "connector.hermes_agent.tenant_mismatch"
    MISSING_CREDENTIAL = "connector.hermes_agent.missing_credential"
    AUTHENTICATION = "connector.hermes_agent.authentication"
    REMOTE_TEMPORARY = "connector.hermes_agent.remote_temporary"
    REMOTE_REJECTED = "connector.hermes_agent.remote_rejected"
    TRANSPORT = "connector.hermes_agent.transport"
    STREAM_PUBLICATION = "connector.hermes_agent.stream_publication"
    CANCELLED = "connector.hermes_agent.cancelled"
    DEADLINE_EXCEEDED = "connector.hermes_agent.deadline_exceeded"
    OPERATOR_OUTCOME_UNKNOWN = "connector.hermes_agent.operator_outcome_unknown"
    OPERATOR_STATE = "connector.hermes_agent.operator_state"
    OPERATOR_POLICY = "connector.hermes_agent.operator_policy"
    ERROR = "connector.hermes_agent.error"
    # Parsed stream results.
    STREAM_TRUNCATED = "connector.hermes_agent.stream_truncated"
    STREAM_INCOMPLETE = "connector.hermes_agent.stream_incomplete"
    STREAM_FAILED = "connector.hermes_agent.stream_failed"
    # Operator results.
    OPERATOR_START_REJECTED = "connector.hermes_agent.operator_start_rejected"
    OPERATOR_FAILED = "connector.hermes_agent.operator_failed"
    APPROVAL_OUTCOME_UNKNOWN = "connector.hermes_agent.approval_outcome_unknown"
    CANCELLATION_OUTCOME_UNKNOWN = "connector.hermes_agent.cancellation_outcome_unknown"
    # Operator results of a Hermes newer than 0.19 (docs/operator.md "Newer Hermes").
    OPERATOR_INTERRUPTED = "connector.hermes_agent.operator_interrupted"
    OPERATOR_RUN_NOT_ACTIVE = "connector.hermes_agent.operator_run_not_active"
    APPROVAL_CHOICE_NOT_OFFERED = "connector.hermes_agent.approval_choice_not_offered"
    # Delegated results.
    DELEGATED_RESULT_NOT_READY = "connector.hermes_agent.delegated_result_not_ready"
    DELEGATED_EXECUTION_NOT_OBSERVED = "connector.hermes_agent.delegated_execution_not_observed"
    DELEGATED_ACTION_CONTRACT_MISMATCH = "connector.hermes_agent.delegated_action_contract_mismatch"
    DELEGATED_IDENTITY_UNVERIFIED = "connector.hermes_agent.delegated_identity_unverified"
    DELEGATED_IDENTITY_MISMATCH = "connector.hermes_agent.delegated_identity_mismatch"
    DELEGATED_IDENTITY_INTEGRITY = "connector.hermes_agent.delegated_identity_integrity"
    DELEGATED_TENANT_MISMATCH = "connector.hermes_agent.delegated_tenant_mismatch"
    DELEGATED_TENANT_EXPIRED = "connector.hermes_agent.delegated_tenant_expired"
    DELEGATED_RESULT_INTEGRITY = "connector.hermes_agent.delegated_result_integrity"
    DELEGATED_RESULT_RESOLVER_MISSING = "connector.hermes_agent.delegated_result_resolver_missing"


@dataclass(frozen=True, slots=True)
class CodeRule:
    """How one code behaves: its category, and when it is retryable or uncertain."""

    category: ErrorCategory
    retry: Retry
    uncertain: Uncertainty

    def retryable(self, *, read_only: bool) -> bool:
        return self.retry is Retry.ALWAYS or (self.retry is Retry.READ_ONLY and read_only)

    def uncertain_outcome(self, *, read_only: bool) -> bool:
        return self.uncertain is Uncertainty.ALWAYS or (
            self.uncertain is Uncertainty.UNSAFE and not read_only
        )


_C = ErrorCategory
_R = Retry
_U = Uncertainty
E = ErrorCode

CODE_RULES: dict[ErrorCode, CodeRule] = {
    E.SCHEMA_ENVELOPE_INVALID: CodeRule(_C.PERMANENT, _R.NEVER, _U.NEVER),
    E.ENVELOPE_DECODE_INVALID: CodeRule(_C.PERMANENT, _R.NEVER, _U.NEVER),
    E.HOST_AUTHENTICATION: CodeRule(_C.AUTH, _R.NEVER, _U.NEVER),
    E.HOST_REPLAY: CodeRule(_C.AUTH, _R.NEVER, _U.NEVER),
    E.HOST_ROUTE_MISMATCH: CodeRule(_C.POLICY, _R.NEVER, _U.NEVER),
    E.HOST_CREDENTIAL_REVISION_DENIED: CodeRule(_C.AUTH, _R.NEVER, _U.NEVER),
    E.HOST_APPROVAL_AUTHORIZATION_CONFLICT: CodeRule(_C.POLICY, _R.NEVER, _U.NEVER),
    E.HOST_APPROVAL_AUTHORIZATION_UNAVAILABLE: CodeRule(_C.TEMPORARY, _R.NEVER, _U.NEVER),
    E.HOST_NOT_READY: CodeRule(_C.TEMPORARY, _R.ALWAYS, _U.NEVER),
    E.HOST_CAPACITY: CodeRule(_C.TEMPORARY, _R.ALWAYS, _U.NEVER),
    E.HOST_EXECUTION: CodeRule(_C.CONNECTOR, _R.NEVER, _U.UNSAFE),
    E.HOST_RESPONSE_SIGNING: CodeRule(_C.CONNECTOR, _R.NEVER, _U.NEVER),
    E.CONFIGURATION_OR_INPUT: CodeRule(_C.PERMANENT, _R.NEVER, _U.NEVER),
    E.TENANT_MISMATCH: CodeRule(_C.AUTH, _R.NEVER, _U.NEVER),
    E.MISSING_CREDENTIAL: CodeRule(_C.AUTH, _R.NEVER, _U.NEVER),
    E.AUTHENTICATION: CodeRule(_C.AUTH, _R.NEVER, _U.NEVER),
    E.REMOTE_TEMPORARY: CodeRule(_C.TEMPORARY, _R.READ_ONLY, _U.UNSAFE),
    E.REMOTE_REJECTED: CodeRule(_C.PERMANENT, _R.NEVER, _U.NEVER),
    E.TRANSPORT: CodeRule(_C.TRANSPORT, _R.READ_ONLY, _U.UNSAFE),
    E.STREAM_PUBLICATION: CodeRule(_C.CONNECTOR, _R.NEVER, _U.ALWAYS),
    E.CANCELLED: CodeRule(_C.TEMPORARY, _R.NEVER, _U.NEVER),
    E.DEADLINE_EXCEEDED: CodeRule(_C.TEMPORARY, _R.READ_ONLY, _U.UNSAFE),
    E.OPERATOR_OUTCOME_UNKNOWN: CodeRule(_C.TEMPORARY, _R.NEVER, _U.ALWAYS),
    E.OPERATOR_STATE: CodeRule(_C.TEMPORARY, _R.NEVER, _U.NEVER),
    E.OPERATOR_POLICY: CodeRule(_C.PERMANENT, _R.NEVER, _U.NEVER),
    E.ERROR: CodeRule(_C.CONNECTOR, _R.NEVER, _U.NEVER),
    E.STREAM_TRUNCATED: CodeRule(_C.CONNECTOR, _R.NEVER, _U.UNSAFE),
    E.STREAM_INCOMPLETE: CodeRule(_C.TRANSPORT, _R.NEVER, _U.UNSAFE),
    E.STREAM_FAILED: CodeRule(_C.PERMANENT, _R.NEVER, _U.NEVER),
    E.OPERATOR_START_REJECTED: CodeRule(_C.PERMANENT, _R.NEVER, _U.NEVER),
    E.OPERATOR_FAILED: CodeRule(_C.PERMANENT, _R.NEVER, _U.NEVER),
    E.APPROVAL_OUTCOME_UNKNOWN: CodeRule(_C.TEMPORARY, _R.NEVER, _U.ALWAYS),
    E.CANCELLATION_OUTCOME_UNKNOWN: CodeRule(_C.TEMPORARY, _R.NEVER, _U.ALWAYS),
    # The run ended, interrupted by a Hermes shutdown: terminal, but its tools may have acted.
    E.OPERATOR_INTERRUPTED: CodeRule(_C.TEMPORARY, _R.NEVER, _U.ALWAYS),
    # The command reached a run that had already finished: certainly not applied.
    E.OPERATOR_RUN_NOT_ACTIVE: CodeRule(_C.PERMANENT, _R.NEVER, _U.NEVER),
    # Refused before sending: the decision is not among the prompt's offered choices.
    E.APPROVAL_CHOICE_NOT_OFFERED: CodeRule(_C.POLICY, _R.NEVER, _U.NEVER),
    E.DELEGATED_RESULT_NOT_READY: CodeRule(_C.TEMPORARY, _R.ALWAYS, _U.NEVER),
    E.DELEGATED_EXECUTION_NOT_OBSERVED: CodeRule(_C.POLICY, _R.NEVER, _U.NEVER),
    E.DELEGATED_ACTION_CONTRACT_MISMATCH: CodeRule(_C.POLICY, _R.NEVER, _U.NEVER),
    E.DELEGATED_IDENTITY_UNVERIFIED: CodeRule(_C.AUTH, _R.NEVER, _U.NEVER),
    E.DELEGATED_IDENTITY_MISMATCH: CodeRule(_C.AUTH, _R.NEVER, _U.NEVER),
    E.DELEGATED_IDENTITY_INTEGRITY: CodeRule(_C.AUTH, _R.NEVER, _U.NEVER),
    E.DELEGATED_TENANT_MISMATCH: CodeRule(_C.AUTH, _R.NEVER, _U.NEVER),
    E.DELEGATED_TENANT_EXPIRED: CodeRule(_C.AUTH, _R.NEVER, _U.NEVER),
    E.DELEGATED_RESULT_INTEGRITY: CodeRule(_C.CONNECTOR, _R.NEVER, _U.NEVER),
    E.DELEGATED_RESULT_RESOLVER_MISSING: CodeRule(_C.CONNECTOR, _R.NEVER, _U.NEVER),
}

ErrorMessage = Annotated[str, msgspec.Meta(max_length=2048)]


class ProtocolError(WireStruct, kw_only=True, frozen=True):
    """The only error shape that leaves a worker: typed, flagged, and free of secrets."""

    code: ErrorCode
    category: ErrorCategory
    retryable: bool
    uncertain_outcome: bool
    #: Diagnostic text for people; never a secret, never a provider response body.
    message: ErrorMessage
    endpoint_id: str | None = None
    #: The HTTP status Hermes answered with, when one was received.
    remote_status: int | None = None


_MAX_REASON = 300


class WireError(Exception):
    """The root of the wire layer's exceptions (`schemas/`, `subjects/`)."""


class EnvelopeRejected(WireError):
    """An envelope that cannot be accepted; `code` is the host code for the DLQ."""

    def __init__(self, code: ErrorCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason[:_MAX_REASON]


class InvalidEndpointId(WireError, ValueError):
    """An endpoint id that cannot be normalized into the subject grammar."""


class BodyError(WireError, ValueError):
    """An AIP Envelope body that is not exactly one payload of its message type, or a payload
    its closed type refuses (`schemas.aip.messages.open_body`)."""
