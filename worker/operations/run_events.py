"""The one table of `GET /v1/runs/{id}/events`: which chunk each Hermes run event becomes, and
what it means for the run.

Spec "Observe events and recover by polling" gives the mapping; the event names are the
ones Hermes 0.19.0 sends on that stream (`shared/reference/hermes-0.19.md`: message deltas,
reasoning, `tool.started`/`tool.completed`, approvals, and the three `run.*` terminals).
Any other event is retained by name as progress, never taken for a terminal.

Two readers share it: the governed operator's observer (worker/operator/observe.py), which
turns a meaning into a binding effect, and the raw `runs` stream's classifier
(worker/operations/classifiers.py `RunEvents`), which turns it into a stream terminal and
departs from it only where that capability differs (it does not own approvals; the spec
makes a terminal `error` event a failure of every raw stream).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from schemas.chunk import ChunkKind


class Effect(StrEnum):
    """What a run event means for the run (and, to the operator, for its binding)."""

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
    # After 0.19: the run's gateway shut down mid-run. A failure of the run (the operator
    # tells it apart by name: `operator_interrupted`).
    "run.interrupted": EventRule(ChunkKind.ERROR, Effect.FAILED),
}
#: Any other event is retained by name as progress.
OTHER_EVENT = EventRule(ChunkKind.PROGRESS, Effect.ADVANCE)


def rule_for(event: str) -> EventRule:
    return EVENT_RULES.get(event, OTHER_EVENT)
