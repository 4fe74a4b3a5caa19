"""ChannelDelivery: one normalized result or escalation to be sent into a Hermes session.

Published by the worker whose fenced settle wrote the source result (or by the one that
republishes it) on the work queue `aip.hermes.{endpoint}.egress`, under `Nats-Msg-Id` =
`delivery_id`; a worker serving that endpoint sends it once to
`POST /api/sessions/{session_id}/chat` as the internal delivery Action `delivery_id`, whose
chunks carry the session's reply and whose result says how the delivery ended.
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
    #: The normalized, bounded text sent as the chat message.
    message: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_CHANNEL_MESSAGE_BYTES)]
    created_at_unix_ms: UnixMs
