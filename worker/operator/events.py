"""What a polled run status means to the operator's observer.

The seven `GET /v1/runs/{id}` statuses -> what the observer concludes, straight from the
spec ("Observe events and recover by polling"); anything outside the table fails closed.
The event stream's table (event name -> chunk kind and meaning) is shared with the raw
`runs` capability: worker/operations/run_events.py.
"""

from __future__ import annotations

from enum import StrEnum


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
