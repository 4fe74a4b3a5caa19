"""The AIP 1.0 message registry: every message type, its body key, and the payload type of
those this project speaks (shared/reference/aip-1.0-wire.md §1.1).

`body` is externally tagged: an object with exactly one key, the payload's snake_case name,
whose value is the payload. `open_body` checks that and decodes the payload into its closed
type; `payload_builtins` is the inverse, in upstream's serialized form (what is signed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

from schemas.aip._base import AipStruct
from schemas.aip.action import Action
from schemas.aip.approval import ApprovalDecision, ApprovalRequest
from schemas.aip.audit import AuditEvent, EventStream, EventStreamRequest, ReceiptChain
from schemas.aip.channel import ChannelMessage
from schemas.aip.control import Cancel, Heartbeat, HeartbeatAck
from schemas.aip.delegation import DelegationRequest, DelegationResult
from schemas.aip.escalation import Escalation, EscalationResolution
from schemas.aip.lifecycle import (
    ActionEvents,
    ActionEventsRequest,
    ActionList,
    ActionResultRequest,
    ActionStatus,
    ActionStatusRequest,
    ApprovalQueryRequest,
    ApprovalRecordView,
)
from schemas.aip.manifest import Manifest, ManifestRequest
from schemas.aip.result import ActionResult, ErrorBody
from schemas.aip.stream import Ack, StreamChunk
from schemas.errors import BodyError

#: message_type → the one key of `body` (upstream `MessageType` / `MessageBody`).
BODY_KEYS: Final[Mapping[str, str]] = {
    "aip.core.v1.handshake": "handshake",
    "aip.core.v1.handshake_response": "handshake_response",
    "aip.core.v1.action": "action",
    "aip.core.v1.ack": "ack",
    "aip.core.v1.stream_chunk": "stream_chunk",
    "aip.core.v1.action_result": "action_result",
    "aip.lifecycle.v1.action_status_request": "action_status_request",
    "aip.lifecycle.v1.action_status": "action_status",
    "aip.lifecycle.v1.action_result_request": "action_result_request",
    "aip.lifecycle.v1.action_list_request": "action_list_request",
    "aip.lifecycle.v1.action_list": "action_list",
    "aip.lifecycle.v1.action_events_request": "action_events_request",
    "aip.lifecycle.v1.action_events": "action_events",
    "aip.policy.v1.approval_request": "approval_request",
    "aip.policy.v1.approval_decision": "approval_decision",
    "aip.policy.v1.approval_query_request": "approval_query_request",
    "aip.policy.v1.approval_list_request": "approval_list_request",
    "aip.policy.v1.approval_record_view": "approval_record_view",
    "aip.policy.v1.approval_list": "approval_list",
    "aip.callback.v1.delivery_query_request": "callback_delivery_query_request",
    "aip.callback.v1.delivery_list_request": "callback_delivery_list_request",
    "aip.callback.v1.delivery_record": "callback_delivery_record",
    "aip.callback.v1.delivery_list": "callback_delivery_list",
    "aip.session.v1.session_request": "session_request",
    "aip.session.v1.session_view": "session_view",
    "aip.session.v1.session_list_request": "session_list_request",
    "aip.session.v1.session_list": "session_list",
    "aip.session.v1.session_close_request": "session_close_request",
    "aip.session.v1.session_resume_request": "session_resume_request",
    "aip.session.v1.session_resume": "session_resume",
    "aip.agent.v1.delegation_request": "delegation_request",
    "aip.agent.v1.delegation_result": "delegation_result",
    "aip.transaction.v1.request": "transaction_request",
    "aip.transaction.v1.result": "transaction_result",
    "aip.transaction.v1.query_request": "transaction_query_request",
    "aip.transaction.v1.view": "transaction_view",
    "aip.core.v1.error": "error",
    "aip.core.v1.cancel": "cancel",
    "aip.core.v1.heartbeat": "heartbeat",
    "aip.core.v1.heartbeat_ack": "heartbeat_ack",
    "aip.core.v1.escalation": "escalation",
    "aip.core.v1.escalation_resolution": "escalation_resolution",
    "aip.discovery.v1.manifest_request": "manifest_request",
    "aip.discovery.v1.manifest_response": "manifest",
    "aip.discovery.v1.event_stream_request": "event_stream_request",
    "aip.discovery.v1.event_stream_response": "event_stream",
    "aip.channel.v1.message_created": "channel_message",
    "aip.channel.v1.conversation_updated": "conversation",
    "aip.audit.v1.receipt_chain": "receipt_chain",
    "aip.audit.v1.receipt_query_request": "receipt_query_request",
    "aip.audit.v1.audit_event": "audit_event",
    "aip.audit.v1.audit_query_request": "audit_query_request",
    "aip.audit.v1.audit_query_result": "audit_query_result",
    "aip.resource.v1.resource_list_request": "resource_list_request",
    "aip.resource.v1.resource_list": "resource_list",
    "aip.resource.v1.resource_read_request": "resource_read_request",
    "aip.resource.v1.resource_read_result": "resource_read_result",
    "aip.economic.v1.batch_settlement": "batch_settlement",
}

#: message_type → the payload type, for every message type this project publishes or reads.
PAYLOAD_TYPES: Final[Mapping[str, type[AipStruct]]] = {
    "aip.core.v1.action": Action,
    "aip.core.v1.ack": Ack,
    "aip.core.v1.stream_chunk": StreamChunk,
    "aip.core.v1.action_result": ActionResult,
    "aip.core.v1.error": ErrorBody,
    "aip.core.v1.cancel": Cancel,
    "aip.core.v1.heartbeat": Heartbeat,
    "aip.core.v1.heartbeat_ack": HeartbeatAck,
    "aip.core.v1.escalation": Escalation,
    "aip.core.v1.escalation_resolution": EscalationResolution,
    "aip.lifecycle.v1.action_status_request": ActionStatusRequest,
    "aip.lifecycle.v1.action_status": ActionStatus,
    "aip.lifecycle.v1.action_result_request": ActionResultRequest,
    "aip.lifecycle.v1.action_list": ActionList,
    "aip.lifecycle.v1.action_events_request": ActionEventsRequest,
    "aip.lifecycle.v1.action_events": ActionEvents,
    "aip.policy.v1.approval_request": ApprovalRequest,
    "aip.policy.v1.approval_decision": ApprovalDecision,
    "aip.policy.v1.approval_query_request": ApprovalQueryRequest,
    "aip.policy.v1.approval_record_view": ApprovalRecordView,
    "aip.agent.v1.delegation_request": DelegationRequest,
    "aip.agent.v1.delegation_result": DelegationResult,
    "aip.discovery.v1.manifest_request": ManifestRequest,
    "aip.discovery.v1.manifest_response": Manifest,
    "aip.discovery.v1.event_stream_request": EventStreamRequest,
    "aip.discovery.v1.event_stream_response": EventStream,
    "aip.channel.v1.message_created": ChannelMessage,
    "aip.audit.v1.receipt_chain": ReceiptChain,
    "aip.audit.v1.audit_event": AuditEvent,
}

#: The message type of each payload type (one type each).
MESSAGE_TYPE_OF: Final[Mapping[type[AipStruct], str]] = {
    payload: message_type for message_type, payload in PAYLOAD_TYPES.items()
}


def open_body(message_type: str, body: Any) -> AipStruct:
    """The payload of `body` for `message_type`, decoded into its closed type (from the
    builtins a JSON parser gave: `msgspec.convert`, strict, no coercion)."""
    payload_type = PAYLOAD_TYPES.get(message_type)
    if payload_type is None:
        raise BodyError(f"message type {message_type!r} is not one this connector speaks")
    key = BODY_KEYS[message_type]
    if not isinstance(body, dict) or len(body) != 1 or key not in body:
        keys = sorted(body) if isinstance(body, dict) else type(body).__name__
        raise BodyError(f"body must be {{{key!r}: …}} for {message_type}, got {keys}")
    try:
        return msgspec.convert(body[key], payload_type, strict=True)
    except msgspec.ValidationError as exc:
        raise BodyError(f"body.{key}: {exc}") from None


def payload_builtins(payload: AipStruct) -> tuple[str, dict[str, Any]]:
    """The message type and the `body` of `payload`, as upstream serializes it (absent
    optionals and empty lists omitted, defaulted flags written)."""
    message_type = MESSAGE_TYPE_OF[type(payload)]
    return message_type, {BODY_KEYS[message_type]: msgspec.to_builtins(payload)}


def open_signed_body(message_type: str, body: Any) -> AipStruct:
    """`open_body`, and BodyError unless `body` is already in upstream's serialized form.

    Upstream verifies a signature over its *re-serialization* of the typed Envelope, while
    `worker.aip` takes the body as given. A body signed in another form (a `null` for an
    absent optional, an empty list written, a defaulted flag left out) would verify here
    and fail at every upstream verifier, so a signed body is held to the one form both
    read alike: the one `payload_builtins` writes."""
    payload = open_body(message_type, body)
    _, serialized = payload_builtins(payload)
    if _same_text(body, serialized):
        return payload
    where = _difference(body, serialized, "body")
    if where is not None:
        raise BodyError(
            f"{where} is not as upstream re-serializes it (omit absent optionals and empty "
            "lists, write defaulted flags): a signature over it would not verify there"
        )
    return payload


_sorted_json = msgspec.json.Encoder(order="sorted")


def _same_text(given: Any, serialized: Any) -> bool:
    """True when two values a JSON parser and `msgspec.to_builtins` made print as the same
    sorted JSON: then `_difference` finds nothing (an int and a float, a bool and a number,
    `-0.0` and `0.0` all print apart), in one pass in C instead of a Python walk per member.
    False sends the caller to `_difference`, which names the place."""
    try:
        return bool(_sorted_json.encode(given) == _sorted_json.encode(serialized))
    except (TypeError, ValueError):  # a non-str key, a lone surrogate: walked instead
        return False


def _difference(given: Any, serialized: Any, path: str) -> str | None:
    """The path of the first place `given` and `serialized` differ (None: equal)."""
    if isinstance(given, dict) and isinstance(serialized, dict):
        for key in sorted(set(given) | set(serialized)):
            if key not in given or key not in serialized:
                return f"{path}.{key}"
            where = _difference(given[key], serialized[key], f"{path}.{key}")
            if where is not None:
                return where
        return None
    if isinstance(given, list) and isinstance(serialized, list) and len(given) == len(serialized):
        for index, (one, other) in enumerate(zip(given, serialized, strict=True)):
            where = _difference(one, other, f"{path}[{index}]")
            if where is not None:
                return where
        return None
    same = type(given) is type(serialized) and given == serialized
    return None if same else path
