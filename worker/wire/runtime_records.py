"""The runtime stores' wire: a delegated child's queue entry and lifecycle record
(`schemas.lifecycle.QueueRecord` / `LifecycleRecord`) as signed AIP 1.0
`aip.lifecycle.v1.action_status` Envelopes, and back (shared/reference/aip-1.0-wire.md
§1.7, §7.10).

The mapping (docs/delegation.md "The runtime's stores" has the table):

* both: `action_id`, `state` (our five states are AIP's of the same names), `updated_at`
  (RFC 3339 of `updated_at_unix_ms`, also in the extension);
* a queue entry: `capability_id`, `correlation_id` and `delegation_id` of the child; the
  child Action itself (as an AIP Action, `worker.wire.actions`) and the internal
  authorization context (owner and actor principal, the authenticated principal, tenant
  partition, `enqueued_at_unix_ms`) in `extensions["org.aip-hermes-worker"]`, which AIP's
  ActionStatus has no field for;
* a lifecycle record: the child's durable result as `result`, an AIP ActionResult (its error
  a ProtocolError), with `result_status`, `completed_at` (the settle time) and
  `capability_id`; the extension keeps the capability and the settle time in Unix ms.

Signed by the gateway key (the only writer); a reader decides which keys it trusts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

from schemas.aip.action import Action as AipAction
from schemas.aip.extensions import ActionExtension, StatusExtension
from schemas.aip.lifecycle import ActionStatus
from schemas.aip.result import ActionResult as AipActionResult
from schemas.lifecycle import ChildResult, LifecycleRecord, QueueRecord
from worker.aip.errors import AipWireError
from worker.aip.signing import AipSigner
from worker.wire.actions import aip_action_body, internal_fields, timestamp_of_ms
from worker.wire.delegations import child_action_result
from worker.wire.envelopes import (
    DEFAULT_MAX_ENVELOPE_BYTES,
    Opened,
    extension_as,
    invalid,
    open_envelope,
    open_payload,
    seal,
    without_none,
)
from worker.wire.results import error_from_aip

MESSAGE_TYPE: Final = "aip.lifecycle.v1.action_status"
_TYPES: Final = frozenset({MESSAGE_TYPE})


def _seal(
    body: dict[str, Any],
    extension: dict[str, Any],
    *,
    signer: AipSigner | None,
    sender: Mapping[str, Any],
) -> bytes:
    try:
        typed = msgspec.convert(body, ActionStatus, strict=True)
    except msgspec.ValidationError as exc:
        raise invalid(f"the record is not an AIP ActionStatus: {exc}") from None
    try:
        return seal(
            MESSAGE_TYPE,
            msgspec.to_builtins(typed),
            sender=sender,
            signer=signer,
            extension=extension,
            sent_at=body["updated_at"],
        )
    except AipWireError as exc:
        raise invalid(f"the record cannot be sealed: {exc}") from None


def encode_queue_record(
    record: QueueRecord, *, signer: AipSigner | None, sender: Mapping[str, Any]
) -> bytes:
    """The wire bytes of a child's queue entry; EnvelopeRejected for one that cannot travel."""
    child = record.action
    body: dict[str, Any] = {
        "action_id": child.id,
        "state": record.state.value,
        "updated_at": timestamp_of_ms(record.updated_at_unix_ms),
        "capability_id": child.capability,
    }
    if child.trace is not None and child.trace.correlation_id is not None:
        body["correlation_id"] = child.trace.correlation_id
    if child.delegation is not None:
        body["delegation_id"] = child.delegation.delegation_id
    facts = ActionExtension(
        created_at_unix_ms=child.created_at_unix_ms,
        deadline_unix_ms=child.deadline_unix_ms,
        delegation=child.delegation,
    )
    extension: dict[str, Any] = {
        "record": "queue",
        "updated_at_unix_ms": record.updated_at_unix_ms,
        "action": aip_action_body(child),
        "action_facts": {
            name: (without_none(value) if isinstance(value, msgspec.Struct) else value)
            for name, value in msgspec.structs.asdict(facts).items()
            if value is not None
        },
        "owner_principal_id": record.owner_principal_id,
        "actor_principal_id": record.actor_principal_id,
        "authenticated": without_none(record.authenticated),
        "enqueued_at_unix_ms": record.enqueued_at_unix_ms,
    }
    if record.tenant_partition is not None:
        extension["tenant_partition"] = record.tenant_partition
    return _seal(body, extension, signer=signer, sender=sender)


def encode_lifecycle_record(
    record: LifecycleRecord, *, signer: AipSigner | None, sender: Mapping[str, Any]
) -> bytes:
    """The wire bytes of a child's lifecycle record; EnvelopeRejected when it cannot travel."""
    body: dict[str, Any] = {
        "action_id": record.action_id,
        "state": record.state.value,
        "updated_at": timestamp_of_ms(record.updated_at_unix_ms),
    }
    extension: dict[str, Any] = {
        "record": "lifecycle",
        "updated_at_unix_ms": record.updated_at_unix_ms,
    }
    result = record.result
    if result is not None:
        body["capability_id"] = result.capability
        body["result"] = child_action_result(result)
        body["result_status"] = result.status
        body["completed_at"] = timestamp_of_ms(result.settled_at_unix_ms)
        extension["capability"] = result.capability
        extension["settled_at_unix_ms"] = result.settled_at_unix_ms
    return _seal(body, extension, signer=signer, sender=sender)


def _open(
    data: bytes, max_bytes: int, record: str
) -> tuple[ActionStatus, StatusExtension, Opened]:
    opened = open_envelope(data, message_types=_TYPES, max_bytes=max_bytes)
    typed = open_payload(opened, MESSAGE_TYPE)
    assert isinstance(typed, ActionStatus)
    extension = extension_as(opened, StatusExtension)
    if extension.record is None or extension.updated_at_unix_ms is None:
        raise invalid("an ActionStatus that is not a runtime record (no record, updated_at)")
    if extension.record != record:
        raise invalid(f"a {extension.record} record where a {record} record belongs")
    if timestamp_of_ms(extension.updated_at_unix_ms) != typed.updated_at:
        raise invalid("updated_at and the extension's updated_at_unix_ms differ")
    return typed, extension, opened


def _required(value: Any, name: str) -> Any:
    if value is None:
        raise invalid(f"a queue record's extension has no {name}")
    return value


def decode_queue_record(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
) -> tuple[QueueRecord, Opened]:
    """The queue entry an Envelope carries and the opened Envelope (its `verified` says who
    signed it). EnvelopeRejected for anything the AIP rules or ours refuse."""
    status, extension, opened = _open(data, max_bytes, "queue")
    facts = _required(extension.action_facts, "action_facts")
    try:
        aip_action = msgspec.convert(_required(extension.action, "action"), AipAction, strict=True)
    except msgspec.ValidationError as exc:
        raise invalid(f"extension action is not an AIP Action: {exc}") from None
    if aip_action.id != status.action_id or aip_action.capability_id != status.capability_id:
        raise invalid("the record's action_id or capability_id is not its Action's")
    child = internal_fields(
        aip_action,
        extension=without_none(facts),
        sent_at=status.updated_at,
        correlation_id=status.correlation_id,
    )
    fields: dict[str, Any] = {
        "action": child,
        "owner_principal_id": _required(extension.owner_principal_id, "owner_principal_id"),
        "authenticated": msgspec.to_builtins(_required(extension.authenticated, "authenticated")),
        "actor_principal_id": _required(extension.actor_principal_id, "actor_principal_id"),
        "tenant_partition": extension.tenant_partition,
        "state": status.state.value,
        "enqueued_at_unix_ms": _required(extension.enqueued_at_unix_ms, "enqueued_at_unix_ms"),
        "updated_at_unix_ms": extension.updated_at_unix_ms,
    }
    try:
        record = msgspec.convert(fields, QueueRecord, strict=True)
    except msgspec.ValidationError as exc:
        raise invalid(f"the queue record: {exc}") from None
    return record, opened


def _child_result(status: ActionStatus, extension: StatusExtension) -> ChildResult | None:
    result: AipActionResult | None = status.result
    if result is None:
        return None
    if extension.capability is None or extension.settled_at_unix_ms is None:
        raise invalid("a lifecycle record's result needs the extension's capability and time")
    if status.capability_id != extension.capability:
        raise invalid("capability_id and the extension's capability differ")
    error = None if result.error is None else msgspec.to_builtins(error_from_aip(result.error))
    fields: dict[str, Any] = {
        "action_id": result.action_id,
        "capability": extension.capability,
        "status": result.status.value,
        "output": result.output,
        "error": error,
        "settled_at_unix_ms": extension.settled_at_unix_ms,
    }
    try:
        return msgspec.convert(fields, ChildResult, strict=True)
    except msgspec.ValidationError as exc:
        raise invalid(f"the lifecycle record's result: {exc}") from None


def decode_lifecycle_record(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
) -> tuple[LifecycleRecord, Opened]:
    """The lifecycle record an Envelope carries and the opened Envelope."""
    status, extension, opened = _open(data, max_bytes, "lifecycle")
    fields: dict[str, Any] = {
        "action_id": status.action_id,
        "state": status.state.value,
        "result": _child_result(status, extension),
        "updated_at_unix_ms": extension.updated_at_unix_ms,
    }
    try:
        record = msgspec.convert(fields, LifecycleRecord, strict=True)
    except msgspec.ValidationError as exc:
        raise invalid(f"the lifecycle record: {exc}") from None
    return record, opened


__all__ = [
    "MESSAGE_TYPE",
    "decode_lifecycle_record",
    "decode_queue_record",
    "encode_lifecycle_record",
    "encode_queue_record",
]
