"""Cancel, Heartbeat and HeartbeatAck (shared/reference/aip-1.0-wire.md §1.8, §1.9)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from schemas.aip._base import AipStruct
from schemas.aip.common import Timestamp


class CancelTarget(AipStruct, frozen=True):
    """What to cancel: `{"action": id}` or `{"session": id}` (exactly one)."""

    action: Annotated[str | None, Meta(description="An Action id.")] = None
    session: Annotated[str | None, Meta(description="A session id.")] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.action is None) == (self.session is None):
            raise ValueError("a cancel target names exactly one of `action` or `session`")


class Cancel(AipStruct, frozen=True):
    """A request to cancel; answered by an ActionResult."""

    target: Annotated[CancelTarget, Meta(description="What to cancel.")]
    reason: Annotated[str | None, Meta(description="Why.")] = None


class Heartbeat(AipStruct, frozen=True):
    """Session liveness."""

    sequence: Annotated[int, Meta(ge=0, description="Heartbeat number.")]
    status: Annotated[str | None, Meta(description="Sender status.")] = None
    progress: Annotated[float | None, Meta(description="Progress percentage.")] = None


class HeartbeatAck(AipStruct, frozen=True):
    """The answer to a Heartbeat."""

    sequence: Annotated[int, Meta(ge=0, description="The heartbeat answered.")]
    received_at: Annotated[Timestamp, Meta(description="When it was received.")]
