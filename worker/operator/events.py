"""What a provider event or run status means for the AIP stream and the binding.

Two tables, straight from the spec ("Observe events and recover by polling"): provider
event name -> (AIP chunk kind, binding effect), and the seven `GET /v1/runs/{id}` statuses
-> what the observer concludes. Anything outside the status table fails closed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from schemas.chunk import ChunkKind


class Effect(StrEnum):
    """What an event does to the binding."""

    ADVANCE = "advance"
    APPROVAL = "approval"
    FAILED = "failed"
    COMPLETED = "completed"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class EventRule:
    kind: ChunkKind
    effect: Effect


EVENT_RULES: dict[str, EventRule] = {
    "message.delta": EventRule(ChunkKind.DATA, Effect.ADVANCE),
    "reasoning.available": EventRule(ChunkKind.THOUGHT, Effect.ADVANCE),
    "tool.started": EventRule(ChunkKind.TOOL, Effect.ADVANCE),
    "tool.completed": EventRule(ChunkKind.TOOL, Effect.ADVANCE),
    "approval.request": EventRule(ChunkKind.PENDING_APPROVAL, Effect.APPROVAL),
    "run.failed": EventRule(ChunkKind.ERROR, Effect.FAILED),
    "run.completed": EventRule(ChunkKind.DONE, Effect.COMPLETED),
    "run.cancelled": EventRule(ChunkKind.DONE, Effect.CANCELLED),
}
#: Any other event is retained by name as progress.
OTHER_EVENT = EventRule(ChunkKind.PROGRESS, Effect.ADVANCE)


def rule_for(event: str) -> EventRule:
    return EVENT_RULES.get(event, OTHER_EVENT)


class ProviderStatus(StrEnum):
    """The seven statuses Hermes 0.19.0 reports for a run; nothing else is recognized."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING_FOR_APPROVAL = "waiting_for_approval"
    STOPPING = "stopping"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Reading(StrEnum):
    """What one status tells the observer."""

    ACTIVE = "active"
    APPROVAL = "approval"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


STATUS_READINGS: dict[ProviderStatus, Reading] = {
    ProviderStatus.QUEUED: Reading.ACTIVE,
    ProviderStatus.RUNNING: Reading.ACTIVE,
    # A stop receipt is progress, never terminal evidence.
    ProviderStatus.STOPPING: Reading.ACTIVE,
    ProviderStatus.WAITING_FOR_APPROVAL: Reading.APPROVAL,
    ProviderStatus.COMPLETED: Reading.COMPLETED,
    ProviderStatus.FAILED: Reading.FAILED,
    ProviderStatus.CANCELLED: Reading.CANCELLED,
}

#: The provider event a polled terminal status stands for, so replayed output looks alike.
TERMINAL_EVENT: dict[Reading, str] = {
    Reading.COMPLETED: "run.completed",
    Reading.FAILED: "run.failed",
    Reading.CANCELLED: "run.cancelled",
}


def parse_status(value: object) -> ProviderStatus | None:
    """The recognized status, or None: the caller must then fail closed."""
    if not isinstance(value, str):
        return None
    try:
        return ProviderStatus(value)
    except ValueError:
        return None
