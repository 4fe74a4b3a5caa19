"""The delegations subject's wire: an internal `schemas.delegation.DelegationRequest` as a
signed AIP 1.0 `aip.agent.v1.delegation_request` Envelope, and back
(shared/reference/aip-1.0-wire.md §1.12, §7.5).

The mapping (docs/publishing.md "DelegationRequest" has the table):

* `delegation_id` keeps its name; the child's `delegation.parent_action_id` is the
  required `parent_action_id` (a request without one cannot travel).
* `delegator` (our Identity) → `requested_by`, a Principal whose `auth_context` carries
  the issuer, credential revision, tenant and our own kind word (as an Action's actor does,
  `worker.wire.actions`); `delegate` → a Principal `{id, kind: agent}`.
* `action` (the ChildAction) → `child_action`, a full AIP Action (`aip_action_body`).
* `chain` (principal ids, root first, ending with the delegator) →
  `child_action.delegation_chain`: one DelegationEntry per hop, the last one delegator →
  delegate. Only the ids are ours to keep: a hop before the delegator is written as kind
  `agent`, every hop's `scope` is the request's scope and `delegated_at` its creation.
* `scopes` (a list) → `scope` (one string: the list joined by single spaces) and the list
  itself in `metadata.scopes` (an AIP open slot).
* `created_at_unix_ms`, `deadline_unix_ms`, `approval` (the pointer to the child's durable
  decision), and the child's own `created_at_unix_ms` / `deadline_unix_ms` → the Envelope's
  `extensions["org.aip-hermes-worker"]` (`schemas.aip.extensions.DelegationExtension`). The
  child's own ApprovalDecision, when it carries one, is AIP's `child_action.approval`.

Decoding holds the result to the internal request's own constraints (the id forms, the
delegate grammar, at most 64 scopes, the chain's length) and refuses a chain that is not
continuous or does not end at the delegate; every failure is an `EnvelopeRejected` with the
code the DLQ records.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from schemas.aip.action import Action as AipAction
from schemas.aip.delegation import DelegationRequest as AipDelegationRequest
from schemas.aip.delegation import DelegationResult as AipDelegationResult
from schemas.aip.extensions import ChildFacts, DelegationExtension
from schemas.delegation import AGENT_KIND, DelegationRequest
from schemas.errors import ProtocolError
from schemas.lifecycle import ChildResult
from schemas.result import ResultStatus
from worker.aip.errors import AipWireError
from worker.aip.signing import AipSigner
from worker.wire.actions import (
    GATEWAY_SENDER,
    aip_action_body,
    aip_principal_kind,
    internal_fields,
    timestamp_of_ms,
)
from worker.wire.envelopes import (
    DEFAULT_MAX_ENVELOPE_BYTES,
    Opened,
    extension_as,
    invalid,
    open_envelope,
    open_payload,
    seal,
    sent_at_ms,
    without_none,
)
from worker.wire.results import error_to_aip, truncate_message

MESSAGE_TYPE: Final = "aip.agent.v1.delegation_request"
_TYPES: Final = frozenset({MESSAGE_TYPE})
#: How the scope list is joined into AIP's one `scope` string.
SCOPE_SEPARATOR: Final = " "
#: The kind a chain hop before the delegator is written with (we keep only its id).
HOP_KIND: Final = AGENT_KIND


def _requested_by(request: DelegationRequest) -> dict[str, Any]:
    identity = request.delegator
    kind = aip_principal_kind(identity.principal_kind)
    auth: dict[str, Any] = {}
    if kind != identity.principal_kind:
        auth["principal_kind"] = identity.principal_kind
    if identity.authentication_issuer is not None:
        auth["issuer"] = identity.authentication_issuer
    if identity.credential_revision is not None:
        auth["credential_revision"] = identity.credential_revision
    if identity.tenant_id is not None:
        auth["tenant_id"] = identity.tenant_id
    principal: dict[str, Any] = {"id": identity.principal_id, "kind": kind}
    if auth:
        principal["auth_context"] = auth
    return principal


def _chain_entries(request: DelegationRequest, scope: str) -> list[dict[str, Any]]:
    delegated_at = timestamp_of_ms(request.created_at_unix_ms)
    delegator = request.delegator.principal_id
    delegator_kind = aip_principal_kind(request.delegator.principal_kind)

    def principal(principal_id: str) -> dict[str, str]:
        if principal_id == request.delegate:
            return {"id": principal_id, "kind": AGENT_KIND}
        kind = delegator_kind if principal_id == delegator else HOP_KIND
        return {"id": principal_id, "kind": kind}

    hops = [*request.chain, request.delegate]
    return [
        {
            "from": principal(source),
            "to": principal(target),
            "scope": scope,
            "delegated_at": delegated_at,
        }
        for source, target in itertools.pairwise(hops)
    ]


def aip_delegation_body(request: DelegationRequest) -> dict[str, Any]:
    """The AIP DelegationRequest of `request` in upstream's serialized form (what is
    signed); EnvelopeRejected (`schema.envelope.invalid`) when it cannot be one."""
    child = request.action
    contract = child.delegation
    if contract is None or contract.parent_action_id is None:
        raise invalid("the child Action names no parent_action_id (AIP requires one)")
    scope = SCOPE_SEPARATOR.join(request.scopes)
    child_body = aip_action_body(child)
    child_body["delegation_chain"] = _chain_entries(request, scope)
    body: dict[str, Any] = {
        "delegation_id": request.delegation_id,
        "parent_action_id": contract.parent_action_id,
        "child_action": child_body,
        "requested_by": _requested_by(request),
        "delegate": {"id": request.delegate, "kind": AGENT_KIND},
        "scope": scope,
        "metadata": {"scopes": list(request.scopes)},
    }
    try:
        typed = msgspec.convert(body, AipDelegationRequest, strict=True)
    except msgspec.ValidationError as exc:
        raise invalid(f"the request is not an AIP DelegationRequest: {exc}") from None
    payload: dict[str, Any] = msgspec.to_builtins(typed)
    return payload


def _extension(request: DelegationRequest) -> dict[str, Any]:
    child = request.action
    facts: dict[str, Any] = {"created_at_unix_ms": child.created_at_unix_ms}
    if child.deadline_unix_ms is not None:
        facts["deadline_unix_ms"] = child.deadline_unix_ms
    extension: dict[str, Any] = {
        "created_at_unix_ms": request.created_at_unix_ms,
        "child": facts,
    }
    if request.deadline_unix_ms is not None:
        extension["deadline_unix_ms"] = request.deadline_unix_ms
    if request.approval is not None:
        extension["approval"] = without_none(request.approval)
    return extension


def encode_delegation(
    request: DelegationRequest,
    *,
    signer: AipSigner | None,
    sender: Mapping[str, Any],
    message_id: str | None = None,
) -> bytes:
    """The wire bytes of `request`: an `aip.agent.v1.delegation_request` Envelope
    (canonical JSON) from `sender`, signed by `signer` (None: unsigned, development only).
    Its `sent_at` is the request's creation, so the bytes are a pure function of the
    request, the key and `message_id` (default: `msg_` + the child Action id's hex digits),
    and a re-send is the same message under the same content-bound `Nats-Msg-Id`.

    EnvelopeRejected (`schema.envelope.invalid`) for a request that cannot travel."""
    child = request.action
    correlation_id = child.trace.correlation_id if child.trace else None
    try:
        return seal(
            MESSAGE_TYPE,
            aip_delegation_body(request),
            sender=sender,
            signer=signer,
            to={"id": request.delegate, "kind": AGENT_KIND},
            correlation_id=correlation_id,
            extension=_extension(request),
            message_id=message_id or f"msg_{child.id.removeprefix('act_')}",
            sent_at=timestamp_of_ms(request.created_at_unix_ms),
        )
    except AipWireError as exc:
        raise invalid(f"the DelegationRequest cannot be sealed: {exc}") from None


def _delegator(principal: dict[str, Any]) -> dict[str, Any]:
    auth = principal.get("auth_context")
    if auth is None:
        auth = {}
    if not isinstance(auth, dict):
        raise invalid("requested_by.auth_context is not an object")
    word = auth.get("principal_kind", principal["kind"])
    if aip_principal_kind(str(word)) != principal["kind"]:
        raise invalid("auth_context.principal_kind does not travel as requested_by's kind")
    identity: dict[str, Any] = {"principal_id": principal["id"], "principal_kind": word}
    for ours, theirs in (
        ("authentication_issuer", "issuer"),
        ("credential_revision", "credential_revision"),
        ("tenant_id", "tenant_id"),
    ):
        if auth.get(theirs) is not None:
            identity[ours] = auth[theirs]
    return identity


def _chain(entries: list[dict[str, Any]], delegate: str) -> list[str]:
    """The principal ids root first, ending with the delegator, of a continuous
    `delegation_chain` whose last hop reaches the delegate."""
    if not entries:
        raise invalid("child_action.delegation_chain is empty (its last hop is the delegation)")
    for earlier, later in itertools.pairwise(entries):
        if earlier["to"]["id"] != later["from"]["id"]:
            raise invalid("child_action.delegation_chain is not continuous")
    if entries[-1]["to"]["id"] != delegate:
        raise invalid("child_action.delegation_chain does not end at the delegate")
    return [entry["from"]["id"] for entry in entries]


def _scopes(payload: dict[str, Any]) -> list[str]:
    scope = str(payload["scope"])
    metadata = payload.get("metadata")
    if metadata is None:
        return [scope]
    if not isinstance(metadata, dict):
        raise invalid("body.delegation_request.metadata is not an object")
    listed = metadata.get("scopes")
    if listed is None:
        return [scope]
    if not isinstance(listed, list) or not all(isinstance(item, str) for item in listed):
        raise invalid("metadata.scopes is not a list of strings")
    if SCOPE_SEPARATOR.join(listed) != scope:
        raise invalid("metadata.scopes joined by spaces is not the request's scope")
    return list(listed)


def _internal(opened: Opened, typed: AipDelegationRequest) -> dict[str, Any]:
    """The internal request's fields (builtins, not yet validated) of a decoded one."""
    aip: dict[str, Any] = msgspec.to_builtins(typed)
    extension = extension_as(opened, DelegationExtension)
    facts = extension.child or ChildFacts()
    delegate = aip["delegate"]
    if delegate["kind"] != AGENT_KIND:
        raise invalid("the delegate must be an agent Principal")
    child = aip["child_action"]
    if child["id"] == aip["parent_action_id"]:
        raise invalid("the child Action's id is the parent's")
    chain = _chain(child.pop("delegation_chain", []), delegate["id"])
    created_at_ms = extension.created_at_unix_ms or sent_at_ms(opened)
    child_extension: dict[str, Any] = {
        "created_at_unix_ms": facts.created_at_unix_ms or created_at_ms,
        "delegation": {
            "delegation_id": aip["delegation_id"],
            "parent_action_id": aip["parent_action_id"],
            "chain": chain,
        },
    }
    if facts.deadline_unix_ms is not None:
        child_extension["deadline_unix_ms"] = facts.deadline_unix_ms
    # The child is decoded by the Action subject's own rules (one mapping of an Action).
    action = internal_fields(
        msgspec.convert(child, AipAction, strict=True),
        extension=child_extension,
        sent_at=str(opened.envelope["sent_at"]),
        correlation_id=opened.envelope.get("correlation_id"),
    )
    fields: dict[str, Any] = {
        "delegation_id": aip["delegation_id"],
        "delegator": _delegator(aip["requested_by"]),
        "delegate": delegate["id"],
        "action": action,
        "chain": chain,
        "scopes": _scopes(aip),
        "created_at_unix_ms": created_at_ms,
    }
    if extension.deadline_unix_ms is not None:
        fields["deadline_unix_ms"] = extension.deadline_unix_ms
    if extension.approval is not None:
        fields["approval"] = without_none(extension.approval)
    return fields


def decode_delegation(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
) -> tuple[DelegationRequest, Opened]:
    """The internal DelegationRequest an `aip.agent.v1.delegation_request` Envelope
    carries, and the opened Envelope (its `verified` says who signed it: which keys to
    trust is the caller's).

    EnvelopeRejected: `envelope.decode.invalid` for bytes that are not one JSON object,
    `schema.envelope.invalid` for a frame, body or request the AIP rules or ours refuse,
    `connector_host.authentication` for a signature that is present and does not verify."""
    opened = open_envelope(data, message_types=_TYPES, max_bytes=max_bytes)
    return delegation_of(opened), opened


def delegation_of(opened: Opened) -> DelegationRequest:
    """The internal DelegationRequest of an opened `aip.agent.v1.delegation_request`
    Envelope (whoever opened it: the delegations subject's intake, or the gateway's
    delegation route, which opens every request itself); EnvelopeRejected
    (`schema.envelope.invalid`) for a body the AIP rules or ours refuse."""
    typed = open_payload(opened, MESSAGE_TYPE)
    assert isinstance(typed, AipDelegationRequest)
    try:
        return msgspec.convert(_internal(opened, typed), DelegationRequest, strict=True)
    except msgspec.ValidationError as exc:
        raise invalid(f"the DelegationRequest: {exc}") from None


def sign_delegation_envelope(
    data: bytes, *, signer: AipSigner, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
) -> bytes:
    """A DelegationRequest Envelope (signed or not) signed again by `signer`, keeping its
    `message_id` and the sender's `{id, kind}` (`GATEWAY_SENDER` when it names none): what
    `aip-hermes sign --kind delegation` prints. EnvelopeRejected when `data` is not one the
    workers decode."""
    request, opened = decode_delegation(data, max_bytes=max_bytes)
    sender = opened.sender
    principal = (
        {key: value for key, value in sender.items() if key != "did"}
        if sender is not None
        else dict(GATEWAY_SENDER)
    )
    return encode_delegation(request, signer=signer, sender=principal, message_id=opened.message_id)


#: What a DelegationResult says of a delegation that ended (AIP's status vocabulary).
_RESULT_STATUS: Final = {
    ResultStatus.COMPLETED: "completed",
    ResultStatus.FAILED: "failed",
    ResultStatus.CANCELLED: "cancelled",
    ResultStatus.REQUIRES_HUMAN: "requires_human",
}


def _child_error(error: dict[str, Any]) -> dict[str, Any]:
    """The child's error (as its executor's result carried it) as an AIP ProtocolError."""
    try:
        return error_to_aip(msgspec.convert(error, ProtocolError, strict=False))
    except msgspec.ValidationError:
        return {
            "code": str(error.get("code", "connector.error"))[:128],
            "message": truncate_message(str(error.get("message", ""))),
            "category": "connector",
            "retryable": bool(error.get("retryable", False)),
        }


def child_action_result(child: ChildResult) -> dict[str, Any]:
    """The child's settled result as an AIP ActionResult (serialized form)."""
    result: dict[str, Any] = {"action_id": child.action_id, "status": child.status}
    if child.output is not None:
        result["output"] = child.output
    if child.error is not None:
        result["error"] = _child_error(child.error)
    return result


def delegation_result(
    request: DelegationRequest,
    status: ResultStatus,
    child: ChildResult | None,
    error: ProtocolError | None,
) -> dict[str, Any]:
    """What became of `request`, as the AIP DelegationResult (§1.12) the delegation's own
    signed result carries in `output.delegation_result`: the child's verified result when
    one was read (its status is the delegation's), else the delegation's own `error` (a
    terminal DelegationResult has one or the other). A request without a parent id never
    got here: it cannot be decoded."""
    contract = request.action.delegation
    parent = contract.parent_action_id if contract is not None else None
    body: dict[str, Any] = {
        "delegation_id": request.delegation_id,
        "parent_action_id": parent or "",
        "child_action_id": request.action.id,
    }
    if child is not None:
        body["status"] = child.status
        body["result"] = child_action_result(child)
    else:
        body["status"] = _RESULT_STATUS[status]
        if error is None:
            raise invalid("a DelegationResult without a child result needs an error")
        body["error"] = error_to_aip(error)
    try:
        typed = msgspec.convert(body, AipDelegationResult, strict=True)
    except msgspec.ValidationError as exc:
        raise invalid(f"the DelegationResult: {exc}") from None
    payload: dict[str, Any] = msgspec.to_builtins(typed)
    return payload


__all__ = [
    "MESSAGE_TYPE",
    "aip_delegation_body",
    "child_action_result",
    "decode_delegation",
    "delegation_of",
    "delegation_result",
    "encode_delegation",
    "sign_delegation_envelope",
]
