"""Execute one admitted delegation: one fenced operator run, then the verified child result.

The run goes through the operator's own machinery (binding, start claim, observation,
polling, cancellation): a delegation can no more start Hermes twice than an objective can.
Only the result differs (spec "Read an operator result": "for first-class delegation, the
native child Action result replaces the provider operator output as the business result"):

* Hermes `completed` -> the resolver waits for the verified child; not observed ->
  `delegated_execution_not_observed`, whatever Hermes wrote;
* Hermes `failed`, `cancelled` or `outcome_unknown` when a run may have happened -> the
  stores are read too: an observed child is waited for and, verified, is the business
  result (it happened); an unseen one leaves the operator's own outcome;
* `waiting_for_approval` -> the run is stopped, never parked for a human: Hermes asks
  approval only for a dangerous command, a state-changing tool the delegation forbids. A
  confirmed stop is `operator_policy`; a racing completion is resolved as above; an
  unconfirmed stop is `cancellation_outcome_unknown`.

The output always carries the operator binding too, so the run that did the work is known.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

from schemas.action import Action
from schemas.delegation import DelegationRequest
from schemas.errors import ErrorCode
from schemas.lifecycle import ChildResult
from schemas.manifest import Risk
from schemas.result import ResultStatus
from worker import faults
from worker.delegation.payload import delegated_payload
from worker.delegation.resolver import DelegatedResolver
from worker.delegation.stores import LifecycleStores
from worker.errors import ConnectorError
from worker.operations.base import ExecutionContext, OperationSpec, Outcome, Recovering
from worker.operations.partition import prefix_of
from worker.operator.binding import (
    BindingState,
    OperatorBinding,
    session_id_for,
)
from worker.operator.cancel import reconcile_cancel
from worker.operator.observe import Observer
from worker.operator.operation import binding_exists, start_and_drive
from worker.operator.policy import HermesOperatorPolicy
from worker.operator.result import binding_output, outcome_of
from worker.operator.session import OperatorSession
from worker.store.clock import Clock
from worker.store.keys import ActionKeys
from worker.wire.delegations import delegation_result

if TYPE_CHECKING:
    from worker.store.stores import Stores

S = BindingState

#: Not a published capability: the delegated entry is the delegations subject, not an Action.
DELEGATION_SPEC = OperationSpec(
    name="delegation",
    method="POST",
    route="/v1/runs",
    read_only=False,
    risk=Risk.HIGH,
    # The connector's own delegation approval check covers the child (handler); the
    # internal Action has no approval record of its own.
    approval_required=False,
    idempotency_required=False,
    streaming=True,
    timeout_ms=900_000,
    input_type=DelegationRequest,
    description="first-class delegation of one exact child Action to the Hermes operator",
)


def delegated_output(
    request: DelegationRequest,
    binding: OperatorBinding,
    child: ChildResult | None,
    *,
    status: ResultStatus,
    error: ConnectorError | None,
    endpoint_id: str,
) -> dict[str, Any]:
    """The delegation's output: the AIP DelegationResult (`worker.wire.delegations`), and
    the operator run's evidence (Hermes' own text is never the business result)."""
    failure = None
    if child is None:
        failure = (
            error
            if error is not None
            else ConnectorError(
                ErrorCode.DELEGATED_RESULT_NOT_READY, "the delegation ended without a child result"
            )
        ).to_protocol(endpoint_id=endpoint_id, read_only=False)
    return {
        "delegation_id": request.delegation_id,
        "child_action_id": request.action.id,
        "child_capability": request.action.capability,
        "delegation_result": delegation_result(request, status, child, failure),
        "operator": binding_output(binding),
    }


def _outcome(
    request: DelegationRequest,
    binding: OperatorBinding,
    child: ChildResult | None,
    status: ResultStatus,
    error: ConnectorError | None,
    endpoint_id: str,
) -> Outcome:
    output = delegated_output(
        request, binding, child, status=status, error=error, endpoint_id=endpoint_id
    )
    return Outcome(status, output, error)


class DelegatedOperation:
    handles_cancel: ClassVar[bool] = True
    self_fenced: ClassVar[bool] = True
    #: Its internal Action is an operator Action (worker.delegation.entry).
    collision_code: ClassVar[ErrorCode] = ErrorCode.OPERATOR_POLICY

    def __init__(self, policy: HermesOperatorPolicy, stores: LifecycleStores | None) -> None:
        policy.validate()
        self.spec = dataclasses.replace(DELEGATION_SPEC, timeout_ms=policy.timeout_ms)
        self.policy = policy
        self.stores = stores

    def keys(self, action: Action) -> ActionKeys:
        return ActionKeys.of(action.id)

    async def began(self, stores: Stores, keys: ActionKeys) -> bool:
        """The delegation's operator binding exists: an earlier delivery began it."""
        return await binding_exists(stores, keys)

    def with_stores(self, stores: LifecycleStores) -> DelegatedOperation:
        """The same operation reading the runtime's stores (wired once NATS is connected)."""
        return DelegatedOperation(self.policy, stores)

    async def resolver(self, clock: Clock) -> DelegatedResolver:
        """The resolver over stores that exist; raises `delegated_result_resolver_missing`."""
        if self.stores is None:
            raise ConnectorError(
                ErrorCode.DELEGATED_RESULT_RESOLVER_MISSING,
                "no AIP runtime queue and lifecycle stores are wired into this worker",
            )
        await self.stores.check_available()
        return DelegatedResolver(self.stores, clock, poll_s=self.policy.poll_interval_ms / 1000)

    async def execute(self, ctx: ExecutionContext, params: Any) -> Outcome:
        self.policy.validate()
        params, forbid_start = Recovering.unwrap(params)
        if not isinstance(params, DelegationRequest):
            raise ConnectorError(ErrorCode.CONFIGURATION_OR_INPUT, "not a DelegationRequest")
        request = params
        ctx.hermes.require_key("POST /v1/runs")
        # Before anything is stored or sent: a child whose result cannot be read must not run.
        resolver = await self.resolver(ctx.stores.clock())
        session = OperatorSession(
            ctx, self.policy, ctx.stores.operator, source_action_id=ctx.action.id
        )
        body = delegated_payload(
            self.policy, request, session_id_for(ctx.action.id, prefix_of(ctx))
        )
        binding = await start_and_drive(session, body, forbid_start=forbid_start)
        if binding.status is S.WAITING_FOR_APPROVAL:
            # Hermes asks approval only for a dangerous command: a state-changing tool the
            # delegation forbids. Never park such a run for a human to approve; stop it and
            # take only provider evidence of the end (a racing completion still wins).
            binding = await reconcile_cancel(session, Observer(session))
        return await self._result(session, resolver, request, binding)

    async def _result(
        self,
        session: OperatorSession,
        resolver: DelegatedResolver,
        request: DelegationRequest,
        binding: OperatorBinding,
    ) -> Outcome:
        tenant_id = session.ctx.endpoint.descriptor.tenant_id or request.action.identity.tenant_id
        faults.hit("before_resolve", session.ctx.action.id)
        completed = binding.status is S.COMPLETED
        # A run may have happened when one was bound, or when its start is unknown.
        may_have_run = binding.run_id is not None or binding.status is S.OUTCOME_UNKNOWN
        child: ChildResult | None = None
        endpoint_id = session.ctx.endpoint.id
        if completed or (binding.terminal and may_have_run):
            try:
                child = await resolver.resolve(
                    request, tenant_id, session.remaining_s, unseen_is_final=completed
                )
            except ConnectorError as exc:
                return _outcome(request, binding, None, ResultStatus.FAILED, exc, endpoint_id)
        if child is not None:
            # The child's own status is the business status; its own error (a foreign
            # code) stays in `delegation_result.result.error`.
            return _outcome(request, binding, child, ResultStatus(child.status), None, endpoint_id)
        # Durable, so any owner concludes the same: the run asked for a provider approval.
        if binding.status is S.CANCELLED and binding.approval_generation > 0:
            refusal = ConnectorError(
                ErrorCode.OPERATOR_POLICY,
                "the delegated run asked for a provider approval, i.e. tried a "
                "state-changing tool the delegation forbids; it was stopped",
            )
            return _outcome(request, binding, None, ResultStatus.FAILED, refusal, endpoint_id)
        operator = outcome_of(binding)
        return _outcome(request, binding, None, operator.status, operator.error, endpoint_id)
