"""The channel records, as the workers hold them (the wire is `worker.wire.channels`).

ChannelDelivery: one normalized result or escalation to be sent into a Hermes session.
Published by the worker whose fenced settle wrote the source result (or by the one that
republishes it) on the work queue `aip.hermes.{endpoint}.egress`, under `Nats-Msg-Id` =
`delivery_id`, as the AIP `aip.core.v1.action` Envelope of the `session_chat` Action it runs
as (its rule and source in our extension's `channel_delivery`), signed by the worker's
response key. A worker serving that endpoint sends it once to
`POST /api/sessions/{session_id}/chat` as that Action, whose chunks carry the session's
reply and whose result says how the delivery ended. The receiving worker believes only the
ids: it recomputes the text from the source's stored result and the rule, and refuses a
delivery whose `message` differs (docs/channels.md).

ChannelMessage: one message of a followed session, published as an AIP
`aip.channel.v1.message_created` Envelope (docs/publishing.md "Channels on the wire").
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import msgspec

from schemas._base import WireStruct
from schemas.ids import ActionId, EndpointId, ShortText, UnixMs

#: The hard ceiling of one normalized message (a rule's `max_message_bytes` is at most this).
MAX_CHANNEL_MESSAGE_BYTES = 32 * 1024
#: Hermes refuses ids with `..`, `/`, `\`, CR/LF/NUL or a leading `X:`; so does the rule file.
SESSION_ID_PATTERN = r"^(?!.*\.\.)(?![A-Za-z]:)[^/\\\r\n\x00]{1,256}\Z"

SessionId = Annotated[str, msgspec.Meta(pattern=SESSION_ID_PATTERN)]


class ChannelSource(StrEnum):
    RESULT = "result"
    ESCALATION = "escalation"


class ChannelDelivery(WireStruct, kw_only=True, frozen=True):
    """A normalized ActionResult or Escalation bound for one persisted Hermes session."""

    #: The delivery Action's id, derived from the rule and the source (idempotent).
    delivery_id: ActionId
    rule_id: ShortText
    source: ChannelSource
    source_action_id: ActionId
    #: The escalation id for an escalation, else the source Action id.
    source_id: ShortText
    endpoint_id: EndpointId
    session_id: SessionId
    #: The normalized, bounded, framed text sent as the chat message; the receiving worker
    #: sends its own recomputation and refuses a delivery whose text differs from it.
    message: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_CHANNEL_MESSAGE_BYTES)]
    created_at_unix_ms: UnixMs


#: Ingress sessions appear in a subject token: letters, digits, `_` and `-` only.
INGRESS_SESSION_PATTERN = r"^[A-Za-z0-9_-]{1,128}\Z"
#: The largest message content published; longer content is cut and flagged.
MAX_INGRESS_CONTENT_BYTES = 64 * 1024


class ChannelRole(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"
    SYSTEM = "system"


class ChannelMessage(WireStruct, kw_only=True, frozen=True):
    """One message of a followed Hermes session, on `aip.hermes.{endpoint}.inbound.{session}`
    as a signed `aip.channel.v1.message_created` Envelope under `Nats-Msg-Id`
    `{endpoint}:{message_id}` (Hermes message ids are unique per server); a reader verifies
    its signature against the trusted worker keys."""

    endpoint_id: EndpointId
    session_id: Annotated[str, msgspec.Meta(pattern=INGRESS_SESSION_PATTERN)]
    #: Hermes' message id (global autoincrement of its state.db): the follow cursor.
    message_id: Annotated[int, msgspec.Meta(ge=0)]
    role: ChannelRole
    content: Annotated[str, msgspec.Meta(max_length=MAX_INGRESS_CONTENT_BYTES)]
    #: True when the content was cut at MAX_INGRESS_CONTENT_BYTES; `content_bytes` is its size.
    content_truncated: bool = False
    content_bytes: Annotated[int, msgspec.Meta(ge=0)]
    tool_name: ShortText | None = None
    tool_call_id: ShortText | None = None
    finish_reason: ShortText | None = None
    #: Hermes' message time (epoch seconds).
    timestamp: float | None = None
    #: When the follower published it (the Envelope's `sent_at`).
    published_at_unix_ms: UnixMs
