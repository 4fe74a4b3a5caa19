"""Who may resume an operator run: the principal that started it, or an authority member
of its tenant.

A resume (`{"resume": {"source_action_id", "choice"}}` on the operator capability) answers
the approval prompt of another Action's run, so the approval it carries is not enough: a
principal of tenant b with an approver of tenant b could otherwise answer a tenant-a run's
`chmod 777` prompt. The source binding records the verified principal and tenant of the
Action that started the run (`worker.operator.binding.new_binding`); the trust gate admits
a resume only when

1. its verified principal is that principal, in that tenant; or
2. its verified principal holds a live approval-authority membership *for the source's
   tenant* whose capability prefixes cover the operator capability.

Everything else is refused with `connector_host.approval_authorization_conflict` (the
cancel check's code: a claim of authority over an Action that its durable record
contradicts), before anything is sent to Hermes. A binding an older worker wrote records
no principal: the source's lease (which records the verified principal and tenant at
acquisition) answers instead, and without one nobody may resume it. A missing binding is
left to the resume ledger, which refuses it (`operator_policy`) without contacting Hermes
either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schemas.action import Action
from schemas.errors import ErrorCode
from schemas.ids import is_action_id
from worker.errors import ConnectorError, NotAuthorized, StoreUnavailable
from worker.store.clock import Clock
from worker.store.keys import ActionKeys, binding_key
from worker.trust.authority import ApprovalAuthority
from worker.trust.files import describe_principal
from worker.trust.identities import TrustedIdentity

if TYPE_CHECKING:
    from worker.store.stores import Stores

#: The operation whose `resume` branch answers another Action's run.
OPERATOR_OPERATION = "operator"


def resume_source(operation: str, action: Action) -> str | None:
    """The source Action id a resume names, or None when `action` is no operator resume."""
    if operation != OPERATOR_OPERATION:
        return None
    resume = action.input.get("resume")
    if not isinstance(resume, dict):
        return None
    source = resume.get("source_action_id")
    return source if isinstance(source, str) and is_action_id(source) else None


def _refuse(why: str) -> ConnectorError:
    return ConnectorError(ErrorCode.HOST_APPROVAL_AUTHORIZATION_CONFLICT, f"resume: {why}")


async def check_resume(
    *,
    source_action_id: str,
    action: Action,
    identity: TrustedIdentity,
    authority: ApprovalAuthority | None,
    stores: Stores,
    clock: Clock,
) -> None:
    """Raise ConnectorError unless `identity` may resume the run of `source_action_id`."""
    from worker.operator.binding import decode_binding

    try:
        stored = await stores.operator.read(binding_key(source_action_id))
    except StoreUnavailable as exc:
        raise ConnectorError(
            ErrorCode.OPERATOR_STATE, f"operator state unavailable: {exc}"
        ) from None
    if stored.doc is None:
        return
    binding = decode_binding(stored.doc)
    owner, tenant = binding.principal_id, binding.tenant_id
    if owner is None:
        # An older worker's binding: the source's lease recorded its verified principal
        # and tenant at acquisition (what a cancel is authorized against).
        subject = await _lease_subject(stores, source_action_id)
        if subject is None:
            raise _refuse(
                "the source binding records no principal (written by an older worker) and "
                "its lease is gone; nobody may resume it"
            )
        owner, tenant = subject
    if identity.principal_id == owner and identity.tenant_id == tenant:
        return
    who = describe_principal(identity.principal_id)
    if authority is None:
        raise _refuse(
            f"{who} did not start the source run and no approval authority file is configured"
        )
    try:
        authority.authorize(
            principal_id=identity.principal_id,
            tenant_id=tenant,
            capability=action.capability,
            now_ms=await clock.now_ms(),
        )
    except NotAuthorized as exc:
        raise _refuse(f"not the source run's principal, and {exc}") from None


async def _lease_subject(stores: Stores, source_action_id: str) -> tuple[str, str | None] | None:
    try:
        subject = await stores.leases.cancel_subject(ActionKeys.of(source_action_id))
    except StoreUnavailable as exc:
        raise ConnectorError(
            ErrorCode.OPERATOR_STATE, f"operator state unavailable: {exc}"
        ) from None
    return None if subject is None else (subject.principal_id, subject.tenant_id)
