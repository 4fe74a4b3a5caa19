"""An operator result is the source binding, never an unstructured provider body.

Spec "Read an operator result": the output names the endpoint, run, session, source Action,
delegation correlation, binding status, last event, pending approval and the provider
evidence; terminal binding states map to Completed, Failed, Cancelled or RequiresHuman. A
resume returns the same shape under its own Action id, with `source_action_id` still
naming the original binding.
"""

from __future__ import annotations

from typing import Any

from schemas.errors import ErrorCode
from schemas.result import ResultStatus
from worker.errors import ConnectorError
from worker.operations.base import Outcome
from worker.operator.binding import BindingState, OperatorBinding

S = BindingState

_STATUS: dict[BindingState, ResultStatus] = {
    S.COMPLETED: ResultStatus.COMPLETED,
    S.FAILED: ResultStatus.FAILED,
    S.CANCELLED: ResultStatus.CANCELLED,
    S.OUTCOME_UNKNOWN: ResultStatus.FAILED,
    S.WAITING_FOR_APPROVAL: ResultStatus.REQUIRES_HUMAN,
}


def binding_output(binding: OperatorBinding) -> dict[str, Any]:
    return {
        "endpoint_id": binding.endpoint_id,
        "run_id": binding.run_id,
        "session_id": binding.session_id,
        "source_action_id": binding.action_id,
        "delegation_id": binding.delegation_id,
        "parent_action_id": binding.parent_action_id,
        "status": binding.status.value,
        "last_event": binding.last_event,
        "pending_approval": binding.pending_approval,
        "approval_generation": binding.approval_generation,
        "provider": binding.output,
    }


def outcome_of(binding: OperatorBinding, error: ConnectorError | None = None) -> Outcome:
    """The Action's outcome from its (source) binding; `error` overrides the binding's own
    (a resume whose own command failed reports that, over the source's state)."""
    output = binding_output(binding)
    if error is not None:
        return Outcome(ResultStatus.FAILED, output, error)
    status = _STATUS.get(binding.status)
    if status is None:
        # Every path ends terminal or waiting; a live binding here is a connector bug, and
        # the run may be working: say so rather than guess.
        return Outcome(
            ResultStatus.FAILED,
            output,
            ConnectorError(
                ErrorCode.OPERATOR_OUTCOME_UNKNOWN,
                f"the operator invocation ended with its binding still {binding.status.value}",
            ),
        )
    stored = None if binding.error is None else binding.error.to_error()
    if status is ResultStatus.FAILED and stored is None:
        stored = ConnectorError(ErrorCode.OPERATOR_FAILED, "the bound Hermes run reported failure")
    if status is ResultStatus.CANCELLED and stored is None:
        stored = ConnectorError(ErrorCode.CANCELLED, "the operator run was cancelled on request")
    return Outcome(status, output, stored)
