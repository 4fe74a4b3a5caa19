"""DelegationRequest on `aip.hermes.{endpoint}.delegations`."""

from __future__ import annotations

from typing import Annotated

import msgspec

from schemas._base import WireStruct
from schemas.action import Action, ApprovalRef, Identity
from schemas.ids import ShortText

DELEGATE_PATTERN = r"^agent:hermes_operator:[a-z0-9][a-z0-9_-]{0,62}$"


class DelegationRequest(WireStruct, kw_only=True, frozen=True):
    delegation_id: ShortText
    #: The principal delegating the child Action.
    delegator: Identity
    #: `agent:hermes_operator:{endpoint}`: the delegate principal selects the endpoint.
    delegate: Annotated[str, msgspec.Meta(pattern=DELEGATE_PATTERN)]
    #: The exact child Action; it keeps its real capability id.
    action: Action
    chain: Annotated[list[ShortText], msgspec.Meta(max_length=128)] = msgspec.field(
        default_factory=list
    )
    approval: ApprovalRef | None = None
