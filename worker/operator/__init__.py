"""The governed Hermes operator (`cap:hermes_agent:{endpoint}:operator`).

A durable binding in Redis around a volatile Hermes structured run: it fences the
non-idempotent start, observes the run through its event stream or by polling, resumes
provider approvals through a command ledger, and reconciles cancellation, so no crash,
pause or duplicate ever starts a run twice or settles a result it no longer owns.
"""

from typing import TYPE_CHECKING

from worker.lazy import lazy_exports

if TYPE_CHECKING:
    from worker.operator.cancel import request_cancel
    from worker.operator.operation import OPERATOR_SPEC, OperatorOperation, operator_operation
    from worker.operator.policy import HermesOperatorPolicy

__all__ = [
    "OPERATOR_SPEC",
    "HermesOperatorPolicy",
    "OperatorOperation",
    "operator_operation",
    "request_cancel",
]

__getattr__ = lazy_exports(
    __name__,
    {
        "request_cancel": "worker.operator.cancel",
        "OPERATOR_SPEC": "worker.operator.operation",
        "OperatorOperation": "worker.operator.operation",
        "operator_operation": "worker.operator.operation",
        "HermesOperatorPolicy": "worker.operator.policy",
    },
)
