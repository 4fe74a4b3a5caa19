"""The operator capability's input: exactly one of `objective` or `resume`."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import msgspec

from schemas._base import WireStruct
from schemas.ids import ActionId

NonEmptyCapability = Annotated[str, msgspec.Meta(min_length=1, max_length=512)]


class ApprovalChoice(StrEnum):
    ONCE = "once"
    SESSION = "session"
    ALWAYS = "always"
    DENY = "deny"


class OperatorObjective(WireStruct, kw_only=True, frozen=True):
    objective: Annotated[str, msgspec.Meta(min_length=1)]
    #: Application context: data for the model, never authority.
    context: Any = None
    #: Hints only; they admit nothing and authorize nothing.
    candidate_capabilities: Annotated[list[NonEmptyCapability], msgspec.Meta(max_length=256)] = (
        msgspec.field(default_factory=list)
    )
    constraints: dict[str, Any] = msgspec.field(default_factory=dict)


class OperatorResume(WireStruct, kw_only=True, frozen=True):
    source_action_id: ActionId
    choice: ApprovalChoice
    resolve_all: bool = False


class OperatorInput(WireStruct, kw_only=True, frozen=True):
    """Decoded from `Action.input`; `exactly_one_branch` is checked after decoding."""

    objective: OperatorObjective | None = None
    resume: OperatorResume | None = None

    def exactly_one_branch(self) -> bool:
        return (self.objective is None) != (self.resume is None)
