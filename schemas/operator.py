"""The operator capability's input: exactly one of two flat branches, as the spec shapes it.

An objective is `{"objective": "...", "context"?, "candidate_capabilities"?, "constraints"?}`;
a resume is `{"resume": {...}}` and nothing beside it. Both, neither, or an objective field
beside `resume` is refused while decoding (`OperatorInput.__post_init__`), so no invalid
`OperatorInput` ever exists past the decoder and the runtime refuses it before any lease or
provider request.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, UnsetType

from schemas._base import WireStruct
from schemas.ids import ActionId

NonEmptyCapability = Annotated[str, msgspec.Meta(min_length=1, max_length=512)]

#: The fields of the objective branch; none of them may appear beside `resume`.
OBJECTIVE_FIELDS = ("objective", "context", "candidate_capabilities", "constraints")


class ApprovalChoice(StrEnum):
    ONCE = "once"
    SESSION = "session"
    ALWAYS = "always"
    DENY = "deny"


class OperatorObjective(msgspec.Struct, kw_only=True, frozen=True):
    """A decoded objective branch with its defaults filled in (what the provider payload
    serializes); built by `OperatorInput.branch`, never decoded from the wire itself."""

    objective: str
    #: Application context: data for the model, never authority.
    context: Any = None
    #: Hints only; they admit nothing and authorize nothing.
    candidate_capabilities: list[str] = msgspec.field(default_factory=list)
    constraints: dict[str, Any] = msgspec.field(default_factory=dict)


class OperatorResume(WireStruct, kw_only=True, frozen=True):
    source_action_id: ActionId
    choice: ApprovalChoice
    resolve_all: bool = False


class OperatorInput(WireStruct, kw_only=True, frozen=True):
    """`Action.input` of the operator: exactly one branch, `objective` (flat, with its
    optional `context`, `candidate_capabilities` and `constraints`) or `resume` (alone)."""

    objective: Annotated[
        str, msgspec.Meta(min_length=1, description="The bounded outcome for Hermes to pursue.")
    ] | UnsetType = UNSET
    context: Annotated[
        Any, msgspec.Meta(description="Application context: data for the model, never authority.")
    ] = UNSET
    candidate_capabilities: Annotated[
        list[NonEmptyCapability],
        msgspec.Meta(max_length=256, description="Hints only: they admit and authorize nothing."),
    ] | UnsetType = UNSET
    constraints: Annotated[
        dict[str, Any],
        msgspec.Meta(description="Task-specific limits; they do not override AIP policy."),
    ] | UnsetType = UNSET
    resume: Annotated[
        OperatorResume,
        msgspec.Meta(description="Answer the pending provider approval of an earlier Action."),
    ] | UnsetType = UNSET

    def __post_init__(self) -> None:
        # msgspec turns a ValueError raised here into the decode's ValidationError.
        if isinstance(self.resume, OperatorResume):
            if self.objective is not UNSET:
                raise ValueError("`objective` and `resume` are two branches: send exactly one")
            beside = [name for name in OBJECTIVE_FIELDS if getattr(self, name) is not UNSET]
            if beside:
                fields = ", ".join(beside)
                raise ValueError(f"`resume` takes no objective fields beside it: {fields}")
        elif self.objective is UNSET:
            raise ValueError("exactly one of `objective` or `resume` is required")

    def branch(self) -> OperatorObjective | OperatorResume:
        """The one branch this input holds, with the objective's defaults filled in."""
        if isinstance(self.resume, OperatorResume):
            return self.resume
        assert isinstance(self.objective, str)  # __post_init__: no resume means an objective
        return OperatorObjective(
            objective=self.objective,
            context=None if self.context is UNSET else self.context,
            candidate_capabilities=(
                [] if isinstance(self.candidate_capabilities, UnsetType)
                else self.candidate_capabilities
            ),
            constraints={} if isinstance(self.constraints, UnsetType) else self.constraints,
        )


#: The published JSON Schema of `OperatorInput` also states the one-branch rule that
#: `__post_init__` enforces, so a publisher validating against it is refused the same shapes.
OperatorInputSchema = Annotated[
    OperatorInput,
    msgspec.Meta(
        extra_json_schema={
            "oneOf": [
                {"title": "objective", "required": ["objective"], "not": {"required": ["resume"]}},
                {"title": "resume", "required": ["resume"], "maxProperties": 1},
            ]
        }
    ),
]


class OperatorStatus(StrEnum):
    """The operator binding's state as the output reports it (spec "Follow the operator
    states")."""

    STARTING = "starting"
    RUNNING = "running"
    WAITING_FOR_APPROVAL = "waiting_for_approval"
    CANCELLING = "cancelling"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    OUTCOME_UNKNOWN = "outcome_unknown"


class OperatorOutput(WireStruct, kw_only=True, frozen=True):
    """`ActionResult.output` of every operator Action: the source binding, never an
    unstructured provider body (spec "Read an operator result"). A resume reports its
    source's binding: `source_action_id` names the original Action."""

    endpoint_id: str
    session_id: str
    source_action_id: ActionId
    status: OperatorStatus
    run_id: str | None = None
    delegation_id: str | None = None
    parent_action_id: ActionId | None = None
    last_event: str | None = None
    #: The redacted pending provider approval event, while the run waits for one.
    pending_approval: dict[str, Any] | None = None
    #: How many provider prompts the run has asked (the escalation of a prompt is per
    #: generation); None from workers that predate it.
    approval_generation: int | None = None
    #: Redacted provider evidence of the terminal run (`{"event", "output", …}`).
    provider: dict[str, Any] | None = None
