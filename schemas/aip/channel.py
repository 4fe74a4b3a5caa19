"""ChannelMessage (`aip.channel.v1.message_created`, body key `channel_message`;
shared/reference/aip-1.0-wire.md §1.13)."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta

from schemas.aip._base import AipStruct
from schemas.aip.common import Conversation, IdentityContext, MessagePart, Principal


class ChannelMessage(AipStruct, frozen=True):
    """A message in a channel thread."""

    conversation: Annotated[Conversation, Meta(description="The thread.")]
    message: Annotated[Any, Meta(description="Free provider message metadata.")]
    sender: Annotated[Principal, Meta(description="Who wrote it.")]
    parts: Annotated[list[MessagePart], Meta(description="Its content.")]
    identity: Annotated[IdentityContext | None, Meta(description="Whose thread.")] = None
    delivery: Annotated[Any, Meta(description="Free delivery and idempotency facts.")] = None
    raw_payload: Annotated[Any, Meta(description="Free original provider payload.")] = None
