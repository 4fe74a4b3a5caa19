"""Chat messages as Hermes accepts them in `messages`, `conversation_history` and `input`."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from schemas._base import WireStruct
from worker.operations.input_types import ContentParts, Label, ProviderObject

Role = Literal["system", "developer", "user", "assistant", "tool"]
MessageText = Annotated[str, msgspec.Meta(max_length=262_144)]


class ChatMessage(WireStruct, kw_only=True, frozen=True, omit_defaults=True):
    """One OpenAI-style message; Hermes validates content part types itself (400 if unknown)."""

    role: Role
    content: MessageText | ContentParts | None = None
    name: Label | None = None
    tool_call_id: Label | None = None
    tool_calls: Annotated[list[ProviderObject], msgspec.Meta(max_length=64)] | None = None


Messages = Annotated[list[ChatMessage], msgspec.Meta(min_length=1, max_length=512)]
