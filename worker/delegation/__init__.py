"""First-class delegation: one exact native child Action, handed to Hermes, verified back.

A `DelegationRequest` (an AIP `aip.agent.v1.delegation_request` Envelope,
`worker.wire.delegations`) on `aip.hermes.{endpoint}.delegations` names the delegate
`agent:hermes_operator:{endpoint}` and carries the exact child Action. Under the fail-closed
router policy (`router`), the worker starts one governed operator run whose only task is to
call `aip_call` once with the child's exact arguments (`payload`), on the same fenced binding,
start claim, observation and cancellation machinery as the operator. When the run ends, the
result is the child's *native* result read from the AIP runtime's Action queue and lifecycle
stores and verified field by field (`resolver`); Hermes' own final text is never the result.
"""

from typing import TYPE_CHECKING

from worker.lazy import lazy_exports

if TYPE_CHECKING:
    from worker.delegation.action_id import delegation_action_id
    from worker.delegation.operation import DELEGATION_SPEC, DelegatedOperation

__all__ = ["DELEGATION_SPEC", "DelegatedOperation", "delegation_action_id"]

__getattr__ = lazy_exports(
    __name__,
    {
        "delegation_action_id": "worker.delegation.action_id",
        "DELEGATION_SPEC": "worker.delegation.operation",
        "DelegatedOperation": "worker.delegation.operation",
    },
)
