"""Cancel request/reply on `aip.hermes.{endpoint}.cancel`."""

from __future__ import annotations

from typing import Annotated

import msgspec

from schemas._base import WireStruct
from schemas.errors import ProtocolError
from schemas.ids import ActionId, ShortText


class CancelRequest(WireStruct, kw_only=True, frozen=True):
    action_id: ActionId
    reason: Annotated[str, msgspec.Meta(max_length=1024)] = ""
    requested_by: ShortText


class CancelReply(WireStruct, kw_only=True, frozen=True):
    #: None only when the request was too malformed to name an Action.
    action_id: ActionId | None
    #: True once the cancel intent is durable; the outcome arrives as the ActionResult.
    accepted: bool
    #: What the Action's state is after recording the intent (`unknown` if none was found).
    state: str
    error: ProtocolError | None = None
