"""DelegationRequest and DelegationResult (shared/reference/aip-1.0-wire.md §1.12)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta

from schemas.aip._base import AipStruct
from schemas.aip.action import Action, Callback
from schemas.aip.audit import ReceiptChain
from schemas.aip.common import Principal
from schemas.aip.result import ActionResult, ProtocolError


class DelegationRequest(AipStruct, frozen=True):
    """A parent Action hands a child Action to a delegate."""

    delegation_id: Annotated[str, Meta(description="Edge id (`dlg_…`).")]
    parent_action_id: Annotated[str, Meta(description="The parent Action.")]
    child_action: Annotated[Action, Meta(description="The child Action (its own id).")]
    requested_by: Annotated[Principal, Meta(description="The delegating principal.")]
    delegate: Annotated[
        Principal, Meta(description="Expected executor, e.g. `agent:hermes_operator:h1`.")
    ]
    scope: Annotated[str, Meta(min_length=1, description="The delegated scope.")]
    callback: Annotated[Callback | None, Meta(description="Where the result goes.")] = None
    metadata: Annotated[Any, Meta(description="Free routing metadata.")] = None


class DelegationResult(AipStruct, frozen=True):
    """What became of a delegation."""

    delegation_id: Annotated[str, Meta(description="The delegation answered.")]
    parent_action_id: Annotated[str, Meta(description="Its parent Action.")]
    child_action_id: Annotated[str, Meta(description="Its child Action.")]
    status: Annotated[
        Literal["accepted", "running", "completed", "failed", "cancelled", "requires_human"],
        Meta(description="The delegation's state; a terminal one has `result` or `error`."),
    ]
    result: Annotated[ActionResult | None, Meta(description="The child's result.")] = None
    error: Annotated[
        ProtocolError | None, Meta(description="A failure before any child result.")
    ] = None
    receipt_chain: Annotated[ReceiptChain | None, Meta(description="Proof of the delegation.")] = (
        None
    )
    callback: Annotated[Any, Meta(description="Free dispatcher callback facts.")] = None
