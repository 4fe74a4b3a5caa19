"""Persisted sessions (`/api/sessions…`, Hermes' `state.db`): CRUD, transcript, fork, chat.

Provider quirks the specs account for: a fork marks the source `branched` and writes rows
before validating the title (so it is unsafe even when it answers 400); deleting a session
orphans its forks and cannot be undone (high risk, approval); session chat runs one agent
turn with tools (medium risk) and is not subject to the run cap.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from schemas._base import WireStruct
from worker.hermes.sse import SSELimits
from worker.operations.calls import HermesCall, JsonOperation, body_of
from worker.operations.classifiers import SessionChatEvents
from worker.operations.input_types import (
    ContentParts,
    Instructions,
    Label,
    Prompt,
    SessionId,
    Title,
)
from worker.operations.retry import ReadRetryPolicy
from worker.operations.specs import spec
from worker.operations.streaming import StreamOperation


class SessionListInput(WireStruct, kw_only=True, frozen=True, omit_defaults=True):
    #: Hermes clamps to 200; `has_more` is simply `len(data) == limit`.
    limit: Annotated[int, msgspec.Meta(ge=1, le=200)] | None = None
    offset: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] | None = None
    source: Label | None = None
    include_children: bool | None = None


class SessionRef(WireStruct, kw_only=True, frozen=True):
    session_id: SessionId


class SessionCreateInput(WireStruct, kw_only=True, frozen=True, omit_defaults=True):
    #: Hermes mints `api_<epoch>_<hex>` when absent.
    id: SessionId | None = None
    title: Title | None = None
    model: Label | None = None
    system_prompt: Instructions | None = None


class SessionUpdateInput(WireStruct, kw_only=True, frozen=True, omit_defaults=True):
    """Only the fields Hermes accepts; `title: null` clears the title, absent leaves it."""

    session_id: SessionId
    title: Title | msgspec.UnsetType | None = msgspec.UNSET
    #: The first end reason wins; Hermes ignores later ones.
    end_reason: Label | msgspec.UnsetType = msgspec.UNSET


class SessionForkInput(WireStruct, kw_only=True, frozen=True, omit_defaults=True):
    session_id: SessionId
    #: The child's id (Hermes mints one when absent).
    id: SessionId | None = None
    title: Title | None = None


class SessionChatInput(WireStruct, kw_only=True, frozen=True, omit_defaults=True):
    session_id: SessionId
    message: Prompt | ContentParts
    #: Appended to Hermes' system prompt for this turn only.
    system_message: Instructions | None = None


def _ref(params: Any) -> HermesCall:
    return HermesCall(params={"session_id": params.session_id})


def _with_body(params: Any) -> HermesCall:
    return HermesCall(
        params={"session_id": params.session_id}, body=body_of(params, exclude={"session_id"})
    )


def _list(params: SessionListInput) -> HermesCall:
    return HermesCall(query=body_of(params))


def _create(params: SessionCreateInput) -> HermesCall:
    return HermesCall(body=body_of(params))


def session_operations(
    retry: ReadRetryPolicy, limits: SSELimits
) -> list[JsonOperation | StreamOperation]:
    return [
        JsonOperation(
            spec(
                "sessions_list",
                SessionListInput,
                "Sessions, most recently active first (limit/offset pages)",
            ),
            _list,
            retry=retry,
        ),
        JsonOperation(
            spec("session_create", SessionCreateInput, "Create an empty persisted session"),
            _create,
        ),
        JsonOperation(
            spec("session_get", SessionRef, "One session's metadata"),
            _ref,
            retry=retry,
        ),
        JsonOperation(
            spec("session_patch", SessionUpdateInput, "Set a session's title or end reason"),
            _with_body,
        ),
        JsonOperation(
            spec(
                "session_delete",
                SessionRef,
                "Delete a session and its transcript (forks are orphaned)",
            ),
            _ref,
        ),
        JsonOperation(
            spec(
                "session_messages",
                SessionRef,
                "A session's whole transcript (Hermes does not paginate it)",
            ),
            _ref,
            retry=retry,
        ),
        JsonOperation(
            spec(
                "session_fork",
                SessionForkInput,
                "Copy a session into a child and mark the source branched (not atomic)",
            ),
            _with_body,
        ),
        JsonOperation(
            spec(
                "session_chat",
                SessionChatInput,
                "One synchronous agent turn in a session (tools run server-side)",
            ),
            _with_body,
        ),
        StreamOperation(
            spec(
                "session_chat_stream",
                SessionChatInput,
                "One agent turn in a session, streamed as chunks",
            ),
            _with_body,
            SessionChatEvents,
            limits=limits,
        ),
    ]
