"""The channel subjects' wire (docs/publishing.md "Channels on the wire", docs/channels.md):

- **inbound** `aip.hermes.{endpoint}.inbound.{session}`: each message of a followed Hermes
  session is an `aip.channel.v1.message_created` Envelope carrying an AIP ChannelMessage
  (shared/reference/aip-1.0-wire.md §1.13, §7.9), signed by the worker's response key;
- **egress** `aip.hermes.{endpoint}.egress`: AIP has no message for a delivery record
  (§7.9); an outbound post is, in AIP, an Action on a session capability (§7.13), and
  that is exactly what a delivery runs as here. So a `ChannelDelivery` travels as the
  `aip.core.v1.action` Envelope of its `session_chat` Action (`delivery_action`), signed by
  the worker that queued it, with the rule and source in our extension's `channel_delivery`.

The inbound ChannelMessage: `conversation` = the session ({id: `conv_` + 32 hex stable per
endpoint and session, channel {system `hermes-agent`, endpoint_id, session_id}, status
`open`, external_refs [{system `hermes-agent`, type `session`, id}]}); `sender` a Principal
by role (`sender_of`); `parts` one `text` part, or a `tool_result` part for a tool message
naming its call; `message` the Hermes message's facts (id, role, timestamp, finish_reason,
tool_name, tool_call_id) and `delivery` how it was delivered (content_bytes,
content_truncated, dedupe_id): both free AIP slots, holding our closed objects
(`schemas.aip.extensions`). The Envelope's `message_id` is derived from the endpoint and
the Hermes id, and `sent_at` is when the follower published it.

Each decoder refuses (EnvelopeRejected) anything that is not exactly what its encoder
writes for some record: an egress Action must be, byte for byte in its body, the
`session_chat` Action of the delivery it names.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

import msgspec

from schemas.action import Action, Identity
from schemas.aip.action import Action as AipAction
from schemas.aip.channel import ChannelMessage as AipChannelMessage
from schemas.aip.common import TextPart, ToolResultPart
from schemas.aip.extensions import (
    ActionExtension,
    ChannelDeliveryFacts,
    HermesChannel,
    HermesMessageFacts,
    IngressDeliveryFacts,
)
from schemas.channel import ChannelDelivery, ChannelMessage, ChannelRole
from schemas.ids import capability_id
from worker.aip.signing import AipSigner
from worker.channel.normalize import DELIVERY_SYSTEM_MESSAGE
from worker.wire.actions import aip_action_body, timestamp_of_ms
from worker.wire.envelopes import (
    DEFAULT_MAX_ENVELOPE_BYTES,
    Opened,
    extension_as,
    invalid,
    open_envelope,
    open_payload,
    seal,
    unix_ms_of,
)
from worker.wire.results import worker_principal

MESSAGE_TYPE: Final = "aip.channel.v1.message_created"
ACTION_TYPE: Final = "aip.core.v1.action"
_MESSAGE_TYPES: Final = frozenset({MESSAGE_TYPE})
_ACTION_TYPES: Final = frozenset({ACTION_TYPE})
#: `Conversation.channel.system` and the `external_refs` system of a Hermes session.
CHANNEL_SYSTEM: Final = "hermes-agent"

#: The principal delivery Actions run as: internal, never admitted from the actions subject.
CHANNEL_PRINCIPAL: Final = "connector:hermes_channel"
CHANNEL_PRINCIPAL_KIND: Final = "service"
DELIVERY_OPERATION: Final = "session_chat"
#: An egress Envelope is at most the message ceiling (32 KiB, up to 6x when escaped) plus
#: its frame, ids and signature.
MAX_DELIVERY_BYTES: Final = 256 * 1024


# --- inbound: aip.channel.v1.message_created ------------------------------------------------


def conversation_id(endpoint_id: str, session_id: str) -> str:
    """The `conv_` + 32 hex id of a Hermes session's conversation: stable per endpoint and
    session, so every message of the session names the same thread."""
    seed = f"{CHANNEL_SYSTEM}:{endpoint_id}:{session_id}".encode()
    return "conv_" + hashlib.sha256(seed).hexdigest()[:32]


def inbound_message_id(endpoint_id: str, message_id: int) -> str:
    """The Envelope `message_id` of a Hermes message: derived from its Hermes id (unique per
    server), so every copy of one message claims the same id."""
    seed = f"inbound:{endpoint_id}:{message_id}".encode()
    return "msg_" + hashlib.sha256(seed).hexdigest()[:32]


def inbound_dedupe_id(endpoint_id: str, message_id: int) -> str:
    """The `Nats-Msg-Id` a message is published under (also `delivery.dedupe_id`)."""
    return f"{endpoint_id}:{message_id}"


def sender_of(role: ChannelRole, endpoint_id: str, session_id: str) -> dict[str, str]:
    """`ChannelMessage.sender` by Hermes role (§7.9): the assistant is the endpoint's Hermes
    agent, the user the session's contact, a tool a service, system text the system."""
    if role is ChannelRole.ASSISTANT:
        return {"id": f"agent:hermes_agent:{endpoint_id}", "kind": "agent"}
    if role is ChannelRole.USER:
        return {"id": f"contact:hermes_session:{endpoint_id}:{session_id}", "kind": "contact"}
    if role is ChannelRole.TOOL:
        return {"id": f"service:hermes_tool:{endpoint_id}", "kind": "service"}
    return {"id": f"system:hermes_agent:{endpoint_id}", "kind": "system"}


def _conversation(endpoint_id: str, session_id: str) -> dict[str, Any]:
    return {
        "id": conversation_id(endpoint_id, session_id),
        "channel": {"system": CHANNEL_SYSTEM, "endpoint_id": endpoint_id, "session_id": session_id},
        "status": "open",
        "external_refs": [{"system": CHANNEL_SYSTEM, "type": "session", "id": session_id}],
    }


def _part(message: ChannelMessage) -> dict[str, Any]:
    if message.role is ChannelRole.TOOL and message.tool_call_id is not None:
        return {
            "type": "tool_result",
            "tool_call_id": message.tool_call_id,
            "data": message.content,
        }
    return {"type": "text", "text": message.content}


def _facts(message: ChannelMessage) -> dict[str, Any]:
    facts: dict[str, Any] = {"id": message.message_id, "role": message.role.value}
    for name in ("timestamp", "finish_reason", "tool_name", "tool_call_id"):
        value = getattr(message, name)
        if value is not None:
            facts[name] = value
    return facts


def encode_inbound(message: ChannelMessage, *, signer: AipSigner | None) -> bytes:
    """The wire bytes of one followed-session message: a `message_created` Envelope from
    the worker, signed by its response key `signer` (None: unsigned, development only)."""
    payload = {
        "conversation": _conversation(message.endpoint_id, message.session_id),
        "sender": sender_of(message.role, message.endpoint_id, message.session_id),
        "parts": [_part(message)],
        "message": _facts(message),
        "delivery": {
            "content_bytes": message.content_bytes,
            "content_truncated": message.content_truncated,
            "dedupe_id": inbound_dedupe_id(message.endpoint_id, message.message_id),
        },
    }
    return seal(
        MESSAGE_TYPE,
        payload,
        sender=worker_principal(message.endpoint_id),
        signer=signer,
        message_id=inbound_message_id(message.endpoint_id, message.message_id),
        sent_at=timestamp_of_ms(message.published_at_unix_ms),
    )


def decode_inbound(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
) -> tuple[ChannelMessage, Opened]:
    """The followed-session message in `data` and its Envelope (signature, if any,
    verified; which keys to trust is the caller's decision, `Opened.verified.did`).

    EnvelopeRejected for anything that is not a `message_created` Envelope exactly as a
    follower writes one (`envelope.decode.invalid`, `schema.envelope.invalid`,
    `connector_host.authentication`)."""
    opened = open_envelope(data, message_types=_MESSAGE_TYPES, max_bytes=max_bytes)
    body = open_payload(opened, MESSAGE_TYPE)
    assert isinstance(body, AipChannelMessage)
    if opened.extension:
        raise invalid("channel_message: no extension is written on the inbound subject")
    if body.identity is not None or body.raw_payload is not None:
        raise invalid("channel_message: identity and raw_payload are not written here")
    try:
        facts = msgspec.convert(body.message, HermesMessageFacts, strict=True)
        delivery = msgspec.convert(body.delivery, IngressDeliveryFacts, strict=True)
        channel = msgspec.convert(body.conversation.channel, HermesChannel, strict=True)
    except msgspec.ValidationError as exc:
        raise invalid(f"channel_message: {exc}") from None
    endpoint_id, session_id = channel.endpoint_id, channel.session_id
    conversation = msgspec.to_builtins(body.conversation)
    if conversation != _conversation(endpoint_id, session_id):
        raise invalid("channel_message: the conversation is not the session's")
    if len(body.parts) != 1:
        raise invalid("channel_message: one part is written per message")
    (part,) = body.parts
    if isinstance(part, TextPart) and part.format is None:
        content: Any = part.text
    elif isinstance(part, ToolResultPart) and part.error is None:
        content = part.data
    else:
        raise invalid("channel_message: the part is neither a text nor a tool_result part")
    sent_at_ms = unix_ms_of(str(opened.envelope["sent_at"]))
    if sent_at_ms is None:
        raise invalid("channel_message: sent_at is not a time this reader can read")
    try:
        message = msgspec.convert(
            {
                "endpoint_id": endpoint_id,
                "session_id": session_id,
                "message_id": facts.id,
                "role": facts.role.value,
                "content": content,
                "content_truncated": delivery.content_truncated,
                "content_bytes": delivery.content_bytes,
                "tool_name": facts.tool_name,
                "tool_call_id": facts.tool_call_id,
                "finish_reason": facts.finish_reason,
                "timestamp": facts.timestamp,
                "published_at_unix_ms": sent_at_ms,
            },
            ChannelMessage,
            strict=True,
        )
    except msgspec.ValidationError as exc:
        raise invalid(f"channel_message: {exc}") from None
    if msgspec.to_builtins(part) != _part(message):
        raise invalid("channel_message: the part does not match the message's role")
    if msgspec.to_builtins(body.sender) != sender_of(message.role, endpoint_id, session_id):
        raise invalid("channel_message: the sender is not the one its role names")
    if delivery.dedupe_id != inbound_dedupe_id(endpoint_id, message.message_id):
        raise invalid("channel_message: delivery.dedupe_id is not {endpoint}:{message id}")
    if opened.message_id != inbound_message_id(endpoint_id, message.message_id):
        raise invalid("channel_message: message_id is not derived from the Hermes id")
    return message, opened


# --- egress: the delivery's session_chat Action -----------------------------------------------


def delivery_action(delivery: ChannelDelivery) -> Action:
    """The internal Action a delivery runs as (its input is what the fingerprint covers),
    and whose AIP Action is the delivery's body on the egress queue."""
    return Action(
        id=delivery.delivery_id,
        capability=capability_id(delivery.endpoint_id, DELIVERY_OPERATION),
        input={
            "session_id": delivery.session_id,
            "message": delivery.message,
            "system_message": DELIVERY_SYSTEM_MESSAGE,
        },
        identity=Identity(principal_id=CHANNEL_PRINCIPAL, principal_kind=CHANNEL_PRINCIPAL_KIND),
        created_at_unix_ms=delivery.created_at_unix_ms,
        idempotency_key=delivery.delivery_id,
    )


def _delivery_extension(delivery: ChannelDelivery) -> dict[str, Any]:
    facts = ChannelDeliveryFacts(
        rule_id=delivery.rule_id,
        source=delivery.source,
        source_action_id=delivery.source_action_id,
        source_id=delivery.source_id,
    )
    return {
        "created_at_unix_ms": delivery.created_at_unix_ms,
        "channel_delivery": msgspec.to_builtins(facts),
    }


def encode_delivery(delivery: ChannelDelivery, *, signer: AipSigner | None) -> bytes:
    """The wire bytes of `delivery` on the egress queue: the `aip.core.v1.action` Envelope
    of its `session_chat` Action, from the worker and signed by its response key `signer`
    (None: unsigned, development only). A pure function of the delivery and the key, so a
    re-queue sends the same bytes."""
    return seal(
        ACTION_TYPE,
        aip_action_body(delivery_action(delivery)),
        sender=worker_principal(delivery.endpoint_id),
        signer=signer,
        extension=_delivery_extension(delivery),
        message_id=f"msg_{delivery.delivery_id.removeprefix('act_')}",
        sent_at=timestamp_of_ms(delivery.created_at_unix_ms),
    )


def decode_delivery(
    data: bytes, *, max_bytes: int = MAX_DELIVERY_BYTES
) -> tuple[ChannelDelivery, Opened]:
    """The delivery an egress Envelope names, and the Envelope (signature, if any,
    verified; trusting the key is the caller's decision). EnvelopeRejected for anything
    else, including an Action whose body is not exactly its delivery's `session_chat`
    Action (other input, identity, mode, …) or that carries no `channel_delivery`."""
    opened = open_envelope(data, message_types=_ACTION_TYPES, max_bytes=max_bytes)
    typed = open_payload(opened, ACTION_TYPE)
    assert isinstance(typed, AipAction)
    extension = extension_as(opened, ActionExtension)
    facts = extension.channel_delivery
    if facts is None:
        raise invalid("egress: the Action carries no channel_delivery (not a channel delivery)")
    if set(opened.extension) != {"created_at_unix_ms", "channel_delivery"}:
        raise invalid("egress: the extension holds created_at_unix_ms and channel_delivery only")
    parts = typed.capability_id.split(":")
    given = typed.input if isinstance(typed.input, dict) else {}
    try:
        delivery = msgspec.convert(
            {
                "delivery_id": typed.id,
                "rule_id": facts.rule_id,
                "source": facts.source.value,
                "source_action_id": facts.source_action_id,
                "source_id": facts.source_id,
                "endpoint_id": parts[2] if len(parts) == 4 else "",
                "session_id": given.get("session_id"),
                "message": given.get("message"),
                "created_at_unix_ms": extension.created_at_unix_ms,
            },
            ChannelDelivery,
            strict=True,
        )
    except msgspec.ValidationError as exc:
        raise invalid(f"egress: {exc}") from None
    if opened.payload != aip_action_body(delivery_action(delivery)):
        raise invalid("egress: the Action is not the session_chat Action of its delivery")
    return delivery, opened


__all__ = [
    "ACTION_TYPE",
    "CHANNEL_PRINCIPAL",
    "CHANNEL_PRINCIPAL_KIND",
    "CHANNEL_SYSTEM",
    "DELIVERY_OPERATION",
    "MAX_DELIVERY_BYTES",
    "MESSAGE_TYPE",
    "conversation_id",
    "decode_delivery",
    "decode_inbound",
    "delivery_action",
    "encode_delivery",
    "encode_inbound",
    "inbound_dedupe_id",
    "inbound_message_id",
    "sender_of",
]
