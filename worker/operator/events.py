"""What a polled run status means to the operator's observer.

The seven `GET /v1/runs/{id}` statuses of Hermes 0.19 -> what the observer concludes,
straight from the spec ("Observe events and recover by polling"), plus `interrupted`: a
Hermes newer than 0.19 marks a run its shutdown interrupted so, and keeps that status
pollable across the restart (0.19 forgets the run: a 404, `operator_outcome_unknown`).
Anything outside the table fails closed.
The event stream's table (event name -> chunk kind and meaning) is shared with the raw
`runs` capability: worker/operations/run_events.py.
"""

from __future__ import annotations

from enum import StrEnum


class ProviderStatus(StrEnum):
    """The seven statuses Hermes 0.19.0 reports for a run, and the later `interrupted`;
    nothing else is recognized."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING_FOR_APPROVAL = "waiting_for_approval"
    STOPPING = "stopping"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    #: After 0.19: the run's gateway shut down mid-run; terminal, never resumed.
    INTERRUPTED = "interrupted"


class Reading(StrEnum):
    """What one status tells the observer."""

    ACTIVE = "active"
    APPROVAL = "approval"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"


STATUS_READINGS: dict[ProviderStatus, Reading] = {
    ProviderStatus.QUEUED: Reading.ACTIVE,
    ProviderStatus.RUNNING: Reading.ACTIVE,
    # A stop receipt is progress, never terminal evidence.
    ProviderStatus.STOPPING: Reading.ACTIVE,
    ProviderStatus.WAITING_FOR_APPROVAL: Reading.APPROVAL,
    ProviderStatus.COMPLETED: Reading.COMPLETED,
    ProviderStatus.FAILED: Reading.FAILED,
    ProviderStatus.CANCELLED: Reading.CANCELLED,
    ProviderStatus.INTERRUPTED: Reading.INTERRUPTED,
}

#: The provider event a polled terminal status stands for, so replayed output looks alike.
TERMINAL_EVENT: dict[Reading, str] = {
    Reading.COMPLETED: "run.completed",
    Reading.FAILED: "run.failed",
    Reading.CANCELLED: "run.cancelled",
    Reading.INTERRUPTED: "run.interrupted",
}


def parse_status(value: object) -> ProviderStatus | None:
    """The recognized status, or None: the caller must then fail closed."""
    if not isinstance(value, str):
        return None
    try:
        return ProviderStatus(value)
    except ValueError:
        return None
