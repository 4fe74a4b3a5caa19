"""StreamChunk and Ack (shared/reference/aip-1.0-wire.md §1.5, §1.6)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from msgspec import Meta

from schemas.aip._base import AipStruct, UInt
from schemas.aip.common import MessagePart


class ChunkKind(StrEnum):
    DATA = "data"
    PROGRESS = "progress"
    TOOL = "tool"
    THOUGHT = "thought"
    PREVIEW = "preview"
    PENDING_APPROVAL = "pending_approval"
    ERROR = "error"
    DONE = "done"


class StreamChunk(AipStruct, frozen=True):
    """One piece of a streamed Action; what AIP has no field for (provider event, run id,
    the hash chain) travels in `data`."""

    action_id: Annotated[str, Meta(description="The Action.")]
    sequence: Annotated[int, Meta(ge=0, description="0, 1, 2 … per Action.")]
    kind: Annotated[ChunkKind, Meta(description="What the chunk is.")]
    data: Annotated[Any, Meta(description="Free chunk data.")] = None
    part: Annotated[MessagePart | None, Meta(description="A rich part, e.g. text.")] = None


class AckStatus(StrEnum):
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    QUEUED = "queued"
    STREAMING = "streaming"
    CACHED = "cached"


class Ack(AipStruct, frozen=True):
    """The answer that an Action was taken (or not) before its result exists."""

    action_id: Annotated[str, Meta(description="The Action.")]
    status: Annotated[AckStatus, Meta(description="What happened to it.")]
    reason: Annotated[str | None, Meta(description="Why (for `rejected`).")] = None
    retry_after_ms: Annotated[UInt | None, Meta(description="Retry hint in ms.")] = None
    queue: Annotated[Any, Meta(description="Free queue position facts.")] = None
