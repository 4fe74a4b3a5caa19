"""The published shape of what travels on `aip.hermes.{endpoint}.actions`: an AIP 1.0
Envelope (shared/reference/aip-1.0-wire.md §1.1) whose body is `{"action": Action}`.

A type for the exported JSON Schema and AsyncAPI document only (`schemas/export.py`):
the bus decodes Envelopes with `worker.wire.envelopes.open_envelope` (the frame rules,
signature) and `schemas.aip.messages.open_body` (the closed Action), never through this
type, so the two cannot disagree about what is signed.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from schemas.aip._base import AipStruct, NonEmptyStr
from schemas.aip.action import Action
from schemas.aip.common import Principal, Timestamp


class ActionBody(AipStruct, frozen=True):
    """The body of an `aip.core.v1.action` Envelope: exactly one key, `action`."""

    action: Annotated[Action, Meta(description="The Action.")]


class ActionEnvelope(AipStruct, frozen=True):
    """An AIP 1.0 Envelope carrying one Action, signed by a trusted gateway key."""

    aip_version: Annotated[Literal["1.0"], Meta(description="Always `1.0`.")]
    message_type: Annotated[
        Literal["aip.core.v1.action"], Meta(description="Always `aip.core.v1.action`.")
    ]
    message_id: Annotated[str, Meta(description="Unique message id (`msg_` + 32 hex).")]
    sent_at: Annotated[Timestamp, Meta(description="When it was sent (RFC 3339, UTC).")]
    body: Annotated[ActionBody, Meta(description="`{\"action\": Action}`.")]
    session_id: Annotated[str | None, Meta(description="The active session.")] = None
    correlation_id: Annotated[
        str | None, Meta(description="Request correlation; our `trace.correlation_id`.")
    ] = None
    in_response_to: Annotated[str | None, Meta(description="Unused on an Action.")] = None
    idempotency_key: Annotated[
        NonEmptyStr | None, Meta(description="Envelope-level idempotency key.")
    ] = None
    from_: Annotated[
        Principal | None,
        Meta(description="The sender, with its `did`; set by the signer."),
    ] = msgspec.field(default=None, name="from")
    to: Annotated[Principal | None, Meta(description="The recipient.")] = None
    trace: Annotated[Any, Meta(description="Free trace metadata.")] = None
    security: Annotated[
        Any,
        Meta(description="`{\"did\": did:key, \"signature\": standard base64 (88 chars)}`."),
    ] = None
    extensions: Annotated[
        Any,
        Meta(
            description="`{\"org.aip-hermes-worker\": {created_at_unix_ms, deadline_unix_ms, "
            "approval, delegation}}` (docs/publishing.md, The Action)."
        ),
    ] = None
