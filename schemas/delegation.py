"""DelegationRequest on `aip.hermes.{endpoint}.delegations`, and the child Action it carries.

First-class delegation (spec "Route first-class delegation") hands Hermes one exact native
AIP child Action. The child keeps its *real* capability id, which is any AIP capability, not
only a Hermes one, so it has its own type: an Action whose capability id is any `cap:…` id.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from schemas._base import WireStruct
from schemas.action import Action, ApprovalRef, Identity
from schemas.ids import ShortText, UnixMs

DELEGATE_PATTERN = r"^agent:hermes_operator:[a-z0-9][a-z0-9_-]{0,62}\Z"
DELEGATE_PREFIX = "agent:hermes_operator:"
#: Any AIP capability id: `cap:` + a connector name + one to four further segments.
ANY_CAPABILITY_PATTERN = r"^cap:[a-z0-9][a-z0-9_]{0,63}(:[A-Za-z0-9_.\-]{1,128}){1,4}\Z"
#: The delegate is an Agent principal (spec "Route first-class delegation").
AGENT_KIND = "agent"
#: The scope an authenticated principal needs to create the child Action.
ACTION_WRITE_SCOPE = "action:write"
MAX_SCOPES = 64

AnyCapabilityId = Annotated[str, msgspec.Meta(pattern=ANY_CAPABILITY_PATTERN)]
Scope = Annotated[str, msgspec.Meta(min_length=1, max_length=512)]


class ChildAction(Action, kw_only=True, frozen=True):
    """The exact native child Action: every Action field, any capability id."""

    capability: AnyCapabilityId


class DelegationRequest(WireStruct, kw_only=True, frozen=True):
    delegation_id: ShortText
    #: The principal delegating the child Action (checked against the identity directory).
    delegator: Identity
    #: `agent:hermes_operator:{endpoint}`: the delegate principal selects the endpoint.
    delegate: Annotated[str, msgspec.Meta(pattern=DELEGATE_PATTERN)]
    #: The exact child Action; it keeps its real capability id and protocol-assigned id.
    action: ChildAction
    #: The validated delegation chain, root first, ending with the delegator.
    chain: Annotated[list[ShortText], msgspec.Meta(min_length=1, max_length=128)]
    #: The scopes the delegate receives; each must match the scope-prefix allowlist.
    scopes: Annotated[list[Scope], msgspec.Meta(min_length=1, max_length=MAX_SCOPES)]
    created_at_unix_ms: UnixMs
    deadline_unix_ms: UnixMs | None = None
    approval: ApprovalRef | None = None
