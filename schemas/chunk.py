"""StreamChunk: one typed piece of an Action's progress, published in `seq` order.

The in-process type; on the chunks subject it travels as an unsigned AIP
`aip.core.v1.stream_chunk` Envelope (`worker/wire/chunks.py`).

A tagged union on `kind`, so a consumer can match on the class and a publisher in another
language sees the kinds in the JSON Schema.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import msgspec

from schemas.ids import ActionId, UnixMs


class ChunkKind(StrEnum):
    DATA = "data"
    THOUGHT = "thought"
    TOOL = "tool"
    PROGRESS = "progress"
    PENDING_APPROVAL = "pending_approval"
    ERROR = "error"
    DONE = "done"


class _Chunk(
    msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True, tag_field="kind"
):
    action_id: ActionId
    endpoint_id: str
    #: 0, 1, 2 … per Action, continuous across worker takeovers.
    seq: int
    #: sha256 (hex) of the exact bytes of chunk `seq - 1` as published; None on seq 0. The
    #: signed ActionResult carries the hash of the last chunk, so one signature covers all.
    prev_sha256: str | None = None
    provider_event: str | None = None
    run_id: str | None = None
    payload: Any = None
    ts_unix_ms: UnixMs

    @property
    def kind(self) -> ChunkKind:
        """The chunk's kind (its JSON `kind` tag), for code that does not match on classes."""
        return ChunkKind(str(self.__struct_config__.tag))


class DataChunk(_Chunk, tag="data", frozen=True):
    """Model output (message deltas)."""


class ThoughtChunk(_Chunk, tag="thought", frozen=True):
    """Reasoning the provider chose to expose."""


class ToolChunk(_Chunk, tag="tool", frozen=True):
    """Tool start, progress and completion."""


class ProgressChunk(_Chunk, tag="progress", frozen=True):
    """Any other provider event, retained by name."""


class PendingApprovalChunk(_Chunk, tag="pending_approval", frozen=True):
    """A redacted provider approval prompt; the Action ends `requires_human`."""


class ErrorChunk(_Chunk, tag="error", frozen=True):
    """The stream ended in failure; the ActionResult carries the typed error."""


class DoneChunk(_Chunk, tag="done", frozen=True):
    """The last chunk of an Action, whatever its outcome."""


StreamChunk = (
    DataChunk
    | ThoughtChunk
    | ToolChunk
    | ProgressChunk
    | PendingApprovalChunk
    | ErrorChunk
    | DoneChunk
)

CHUNK_TYPES: dict[ChunkKind, type[_Chunk]] = {
    ChunkKind.DATA: DataChunk,
    ChunkKind.THOUGHT: ThoughtChunk,
    ChunkKind.TOOL: ToolChunk,
    ChunkKind.PROGRESS: ProgressChunk,
    ChunkKind.PENDING_APPROVAL: PendingApprovalChunk,
    ChunkKind.ERROR: ErrorChunk,
    ChunkKind.DONE: DoneChunk,
}


def make_chunk(
    kind: ChunkKind,
    *,
    action_id: str,
    endpoint_id: str,
    seq: int,
    ts_unix_ms: int,
    payload: Any = None,
    provider_event: str | None = None,
    run_id: str | None = None,
    prev_sha256: str | None = None,
) -> StreamChunk:
    """Build the chunk class of `kind`; one constructor keeps publishers from drifting."""
    cls = CHUNK_TYPES[kind]
    chunk = cls(
        action_id=action_id,
        endpoint_id=endpoint_id,
        seq=seq,
        prev_sha256=prev_sha256,
        provider_event=provider_event,
        run_id=run_id,
        payload=payload,
        ts_unix_ms=ts_unix_ms,
    )
    return chunk  # type: ignore[return-value]
