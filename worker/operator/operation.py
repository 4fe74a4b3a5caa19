"""`cap:hermes_agent:{endpoint}:operator`: the governed operator as one operation.

An objective creates (or replays) the Action's binding, fences the provider start, observes
the run, and reconciles a cancel; a resume answers the source run's current approval
through the command ledger and keeps observing. The operation fences its own unsafe call
(`self_fenced`: the start claim) and reconciles cancellation itself (`handles_cancel`).

What the runtime asks of it (worker/operations/base.py): a resume's keys are its source
Action's (`keys`), an objective has begun once its binding exists and a resume once its
command is in the source's ledger (`began`), and an Action id reused with another request
is an `operator_policy` refusal (`collision_code`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

from schemas.action import Action
from schemas.errors import ErrorCode
from schemas.ids import is_action_id
from schemas.operator import OperatorInput, OperatorInputSchema, OperatorObjective, OperatorResume
from schemas.result import ResultStatus
from worker.errors import ConnectorError
from worker.fingerprints import operator_fingerprint
from worker.operations.base import ExecutionContext, Outcome, Recovering
from worker.operations.partition import prefix_of
from worker.operations.specs import spec
from worker.operator.binding import (
    BindingState,
    OperatorBinding,
    collision_error,
    decode_binding,
    new_binding,
    session_id_for,
)
from worker.operator.cancel import reconcile_cancel
from worker.operator.contract import operator_contract
from worker.operator.observe import Observer
from worker.operator.policy import HermesOperatorPolicy
from worker.operator.result import binding_output, outcome_of
from worker.operator.resume import ResumeLedger
from worker.operator.session import OperatorSession
from worker.operator.start import StartFence, provider_payload
from worker.store.keys import ActionKeys
from worker.store.operator_store import OperatorStore

if TYPE_CHECKING:
    from worker.store.stores import Stores

S = BindingState

#: The default of `AIPD_RESULT_TTL_MS`: results are replayed for 24 hours.
DEFAULT_RESULT_TTL_MS = 86_400_000

#: The operator's facts (risk, approval, idempotency, streaming, route) are its catalog row's,
#: like every other capability's; its time budget is the policy's (set per instance below).
OPERATOR_SPEC = spec(
    "operator",
    OperatorInputSchema,
    "Run or resume the governed Hermes operator: a durable binding fences the run start, "
    "approvals resume through a command ledger, cancellation needs provider evidence",
)


async def binding_exists(stores: Stores, keys: ActionKeys) -> bool:
    """True when an earlier delivery got past admission and began this Action's work: an
    objective's own binding exists, or a resume's command is in its source binding's ledger.

    A resume's keys are its source's, whose binding always exists, so for a resume only its
    own command counts: recorded `claimed` before the approval is sent, it is the record that
    the decision may have reached Hermes. A redelivery refused after that (its deadline
    passed while the claim holder was cut off) must settle the command's outcome, never a
    certain refusal (docs/reliability.md, "Bugs found"). A binding that does not parse
    counts as begun: the leased path reports it as a first delivery would.
    """
    doc = (await stores.operator.read(keys.binding)).doc
    if doc is None or not keys.is_resume:
        return doc is not None
    try:
        return decode_binding(doc).command_for(keys.action_id) is not None
    except ConnectorError:
        return True


class OperatorOperation:
    handles_cancel: ClassVar[bool] = True
    self_fenced: ClassVar[bool] = True
    collision_code: ClassVar[ErrorCode] = ErrorCode.OPERATOR_POLICY

    def __init__(
        self, policy: HermesOperatorPolicy, *, idempotency_ttl_ms: int = DEFAULT_RESULT_TTL_MS
    ) -> None:
        policy.validate()
        # The runtime bounds an execution by the spec's timeout: the policy's is the one.
        self.spec = dataclasses.replace(
            OPERATOR_SPEC,
            timeout_ms=policy.timeout_ms,
            contract=operator_contract(idempotency_ttl_ms=idempotency_ttl_ms),
        )
        self.policy = policy

    def keys(self, action: Action) -> ActionKeys:
        """A resume keeps its keys under its source Action's hash tag (docs/architecture.md
        §5), so every script it runs stays in the source's slot."""
        resume = action.input.get("resume")
        if isinstance(resume, dict):
            source = resume.get("source_action_id")
            if isinstance(source, str) and is_action_id(source) and source != action.id:
                return ActionKeys.of(action.id, source_action_id=source)
        return ActionKeys.of(action.id)

    async def began(self, stores: Stores, keys: ActionKeys) -> bool:
        return await binding_exists(stores, keys)

    async def execute(self, ctx: ExecutionContext, params: Any) -> Outcome:
        self.policy.validate()  # "validates this policy before an operator run"
        params, forbid_start = Recovering.unwrap(params)
        if not isinstance(params, OperatorInput):
            raise ConnectorError(
                ErrorCode.CONFIGURATION_OR_INPUT,
                "operator input needs exactly one of `objective` or `resume`",
            )
        ctx.hermes.require_key("POST /v1/runs")
        store = ctx.stores.operator
        branch = params.branch()
        if isinstance(branch, OperatorObjective):
            return await self._objective(ctx, store, branch, forbid_start)
        return await self._resume(ctx, store, branch, forbid_start)

    async def _objective(
        self,
        ctx: ExecutionContext,
        store: OperatorStore,
        objective: OperatorObjective,
        forbid_start: ConnectorError | None = None,
    ) -> Outcome:
        session = OperatorSession(ctx, self.policy, store, source_action_id=ctx.action.id)
        # Built before the binding exists, so an over-size input never leaves one behind;
        # not kept in a local, so the start fence can let go of it once sent.
        return outcome_of(
            await start_and_drive(
                session,
                provider_payload(session, objective, session_id_for(ctx.action.id, prefix_of(ctx))),
                forbid_start=forbid_start,
            )
        )

    async def _resume(
        self,
        ctx: ExecutionContext,
        store: OperatorStore,
        resume: OperatorResume,
        forbid_claim: ConnectorError | None = None,
    ) -> Outcome:
        source = resume.source_action_id
        if source == ctx.action.id or ctx.keys.slot_action_id != source:
            raise ConnectorError(
                ErrorCode.OPERATOR_POLICY,
                "a resume needs a new Action id, keyed under its source Action",
            )
        session = OperatorSession(ctx, self.policy, store, source_action_id=source)
        end = await ResumeLedger(session, resume, forbid_claim=forbid_claim).run()
        if end.cancelled:
            return Outcome(
                ResultStatus.CANCELLED,
                binding_output(end.binding),
                ConnectorError(ErrorCode.CANCELLED, "cancelled before the decision was sent"),
            )
        if end.error is not None:
            return outcome_of(end.binding, end.error)
        return outcome_of(await drive_binding(session, stream=False))


async def start_and_drive(
    session: OperatorSession, body: bytes, *, forbid_start: ConnectorError | None = None
) -> OperatorBinding:
    """The Action's own binding (created, or the stored one), its start fenced with `body`,
    then observed to rest: how an objective and a delegation run alike.

    Reusing the Action id with another endpoint, input or delegation is a collision;
    `forbid_start` (a refused redelivery) ends an unclaimed binding instead of claiming it.
    """
    ctx = session.ctx
    fingerprint = operator_fingerprint(ctx.endpoint.id, ctx.action)
    fence = StartFence(session, body, forbid_start=forbid_start)
    del body  # the fence holds it, and drops it once the start is sent
    binding = await fence.create(
        lambda now: new_binding(
            ctx.action, ctx.endpoint.id, fingerprint, now, partition_prefix=prefix_of(ctx)
        )
    )
    if binding.request_fingerprint != fingerprint or binding.endpoint_id != ctx.endpoint.id:
        raise collision_error()
    stream = False
    if binding.status is S.STARTING:
        await fence.run()
        # Only the invocation that bound the run may read its single-use stream.
        stream = fence.bound
    # The handle holds the current binding; this first copy would live as long as the run.
    del binding
    return await drive_binding(session, stream=stream)


async def drive_binding(session: OperatorSession, *, stream: bool) -> OperatorBinding:
    """Observe until the binding is terminal or waits for a human, reconciling a cancel.

    Shared by the objective, the resume and the first-class delegation entries: however a
    run was started, it is observed, recovered and cancelled the same way.
    """
    observer = Observer(session)
    handle = session.handle
    # The binding is read from the handle at each step, never kept across an await: a
    # copy held while the run is observed would double what each held run keeps.
    while not handle.binding.terminal and handle.binding.status is not S.WAITING_FOR_APPROVAL:
        if handle.binding.status is S.STARTING:
            break  # the start fence ended without a run: nothing to observe
        if handle.binding.status is S.CANCELLING or session.cancel_wanted():
            return await reconcile_cancel(session, observer)
        await observer.follow(stream=stream)
        stream = False
    return handle.binding


def operator_operation(
    policy: HermesOperatorPolicy, *, idempotency_ttl_ms: int = DEFAULT_RESULT_TTL_MS
) -> OperatorOperation:
    """The operator for a validated policy (`HermesOperatorPolicy.from_settings(settings)`);
    `idempotency_ttl_ms` is how long results are kept (`AIPD_RESULT_TTL_MS`), published in
    its contract."""
    return OperatorOperation(policy, idempotency_ttl_ms=idempotency_ttl_ms)
