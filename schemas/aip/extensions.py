"""Our facts that AIP 1.0 has no field for, as they travel in an Envelope's
`extensions["org.aip-hermes-worker"]` (shared/reference/aip-1.0-wire.md §1.0.3: the
Envelope's `extensions` is a free slot, covered by the signature like the rest).

One closed object per message type this project puts on its subjects. These types are the
published description of those objects (`schemas/json/aip.core.v1.*.json` embeds them); the
writers and readers are `worker/wire/*.py`. Every key is optional on the action, since an AIP
client knows nothing of them; on a result and a chunk the keys a worker always writes are
required.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec
from msgspec import Meta

from schemas.action import ApprovalRef, DelegationRef
from schemas.aip.result import ErrorCategory
from schemas.errors import ErrorCode
from schemas.ids import DLQ_ID_PATTERN, ActionId, EndpointId, UnixMs

#: Our namespace in `Envelope.extensions` (reverse-DNS of the project name).
EXTENSION_KEY: Final = "org.aip-hermes-worker"

#: The sha256 of some exact bytes, as lowercase hex.
SHA256_PATTERN: Final = r"^[0-9a-f]{64}\Z"
Sha256Hex = Annotated[str, Meta(pattern=SHA256_PATTERN)]


class _Extension(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """A closed extension object: an unknown key is refused by its reader."""


class ActionExtension(_Extension, frozen=True):
    """What an `aip.core.v1.action` Envelope carries for this worker beyond the AIP Action."""

    created_at_unix_ms: Annotated[
        UnixMs | None,
        Meta(
            description="When the publisher created the Action (Unix ms); absent: the "
            "Envelope's `sent_at` is taken."
        ),
    ] = None
    deadline_unix_ms: Annotated[
        UnixMs | None,
        Meta(description="Absolute deadline (Unix ms) after which the Action is not started."),
    ] = None
    approval: Annotated[
        ApprovalRef | None,
        Meta(
            description="A pointer to the durable approval decision this Action runs under "
            "(never authority by itself: the worker reads the record)."
        ),
    ] = None
    delegation: Annotated[
        DelegationRef | None,
        Meta(description="The delegation this Action is a child of."),
    ] = None


class CancelFacts(_Extension, frozen=True):
    """What a worker found when it took a Cancel (on its answer, a result or an error)."""

    accepted: Annotated[
        bool,
        Meta(
            description="The cancel intent is durable (for an Action no worker holds yet: "
            "until the worker that leases it authorizes it against the Action)."
        ),
    ]
    state: Annotated[
        str,
        Meta(
            max_length=64,
            description="The Action's state after the intent was recorded: `pending` (no "
            "worker holds it yet), `running`, an operator binding's state, `settled`, or "
            "`unknown` (refused before the Action was looked up).",
        ),
    ]


class ResultExtension(_Extension, frozen=True):
    """What an `aip.core.v1.action_result` Envelope carries beyond the AIP ActionResult: the
    fenced settle that wrote it and the bytes it answers."""

    capability: Annotated[str, Meta(description="The capability id of the Action answered.")]
    endpoint_id: Annotated[EndpointId, Meta(description="The Hermes endpoint that ran it.")]
    settled_by: Annotated[str, Meta(description="The worker whose fenced settle wrote this.")]
    fence: Annotated[
        int,
        Meta(description="The lease fence that settle held; a lower fence never overwrites."),
    ]
    settled_at_unix_ms: Annotated[UnixMs, Meta(description="When it was settled (Unix ms).")]
    last_chunk_sha256: Annotated[
        Sha256Hex | None,
        Meta(
            description="sha256 (hex) of the exact published bytes of the Action's last "
            "chunk: this signed result thereby covers the whole chunk chain."
        ),
    ] = None
    action_sha256: Annotated[
        Sha256Hex | None,
        Meta(
            description="sha256 (hex) of the exact bytes of the Action Envelope this result "
            "answers; binds the answer to one Envelope."
        ),
    ] = None
    original_action_id: Annotated[
        ActionId | None,
        Meta(
            description="Set when this is another Action's result, returned for the same "
            "idempotency key: the id of the Action that ran."
        ),
    ] = None
    cancel: Annotated[
        CancelFacts | None,
        Meta(
            description="Only on the answer to a Cancel (never on the results subject): what "
            "the worker found when it took the Cancel."
        ),
    ] = None


class ChunkExtension(_Extension, frozen=True):
    """What an `aip.core.v1.stream_chunk` Envelope carries beyond the AIP StreamChunk."""

    endpoint_id: Annotated[EndpointId, Meta(description="The Hermes endpoint running it.")]
    ts_unix_ms: Annotated[UnixMs, Meta(description="When the chunk was made (Unix ms).")]
    run_id: Annotated[
        str | None, Meta(description="The Hermes run the chunk belongs to, when there is one.")
    ] = None
    provider_event: Annotated[
        str | None,
        Meta(
            description="The operator's provider event, when there is one (a route "
            "operation's is in `data.hermes_sse.event`)."
        ),
    ] = None
    prev_sha256: Annotated[
        Sha256Hex | None,
        Meta(
            description="sha256 (hex) of the exact published bytes of the previous chunk "
            "(sequence - 1); absent on sequence 0. Chunks are unsigned: the signed result's "
            "`last_chunk_sha256` anchors the chain."
        ),
    ] = None


#: The longest wait for a cancel to settle a requester may ask for (ms).
MAX_CANCEL_WAIT_MS: Final = 120_000


class CancelExtension(_Extension, frozen=True):
    """What an `aip.core.v1.cancel` Envelope may carry beyond the AIP Cancel."""

    wait_ms: Annotated[
        Annotated[int, Meta(ge=0, le=MAX_CANCEL_WAIT_MS)] | None,
        Meta(
            description="How long the requester waits for the reply (ms): the worker "
            "answers within the smaller of this and its own bound "
            "(`AIPD_CANCEL_REPLY_WAIT_MS`); 0 answers at once. Absent: the worker's bound.",
        ),
    ] = None


class ErrorExtension(_Extension, frozen=True):
    """What an `aip.core.v1.error` Envelope a worker sends carries beyond the ProtocolError."""

    action_id: Annotated[
        ActionId | None,
        Meta(description="The Action the error is about, when the request named one."),
    ] = None
    endpoint_id: Annotated[
        EndpointId | None, Meta(description="The Hermes endpoint whose worker answered.")
    ] = None
    cancel: Annotated[
        CancelFacts | None,
        Meta(description="On the answer to a Cancel: what the worker found."),
    ] = None


class EscalationExtension(_Extension, frozen=True):
    """What an `aip.core.v1.escalation` Envelope carries beyond the AIP Escalation: which
    Action of which endpoint it is about, and the fenced settle that raised it. (Its id is
    the Envelope's `message_id`: `msg_` + the escalation id's 32 hex digits.)"""

    action_id: Annotated[ActionId, Meta(description="The Action whose result raised it.")]
    endpoint_id: Annotated[EndpointId, Meta(description="The Hermes endpoint that ran it.")]
    capability: Annotated[str, Meta(description="The capability id of that Action.")]
    fence: Annotated[
        int, Meta(ge=0, description="The lease fence of the settle that raised it.")
    ]
    raised_at_unix_ms: Annotated[
        UnixMs, Meta(description="When it was raised (Unix ms; also the Envelope's `sent_at`).")
    ]


class ResolutionExtension(_Extension, frozen=True):
    """What an `aip.core.v1.escalation_resolution` Envelope carries beyond the AIP
    EscalationResolution (the escalation it answers is its `in_response_to`)."""

    action_id: Annotated[ActionId, Meta(description="The Action the escalation is about.")]
    endpoint_id: Annotated[EndpointId, Meta(description="The endpoint that raised it.")]
    resolved_at_unix_ms: Annotated[
        UnixMs, Meta(description="When it was resolved (Unix ms; also `resolved_at`).")
    ]


class DeadLetterFacts(_Extension, frozen=True):
    """One refused message kept on `aip.hermes.{endpoint}.dlq`: why, where it came from,
    and its bytes (at most `AIPD_DLQ_KEEP_BYTES` of them), under the worker's signature."""

    dlq_id: Annotated[
        str,
        Meta(
            pattern=DLQ_ID_PATTERN,
            description="The entry's own id (`dlq_` + 32 hex), also its `Nats-Msg-Id`; the "
            "receipts about a message that was never authenticated are filed under it.",
        ),
    ]
    endpoint_id: Annotated[EndpointId, Meta(description="The endpoint whose worker refused it.")]
    code: Annotated[ErrorCode, Meta(description="The refusal's error code.")]
    category: Annotated[ErrorCategory, Meta(description="The code's error category.")]
    reason: Annotated[
        str,
        Meta(
            max_length=300,
            description="Why it was refused, for people: printable ASCII, at most 300 "
            "characters, never a secret.",
        ),
    ]
    subject: Annotated[str, Meta(description="The subject the refused message arrived on.")]
    stream_seq: Annotated[
        int,
        Meta(
            ge=-1,
            description="Its sequence in the source stream (or the channel's message id); "
            "-1 when it has none.",
        ),
    ]
    worker_id: Annotated[str, Meta(description="The worker that refused it.")]
    size: Annotated[int, Meta(ge=0, description="The refused message's size in bytes.")]
    sha256: Annotated[
        Sha256Hex,
        Meta(description="sha256 (hex) of the whole refused message, also of a truncated one."),
    ]
    kept: Annotated[
        bytes,
        Meta(
            description="The refused message's first bytes (all of them when `size` is "
            "their length), standard base64 with padding: what `dlq replay` republishes."
        ),
    ]


class StatusExtension(_Extension, frozen=True):
    """What an `aip.lifecycle.v1.action_status` Envelope carries beyond the AIP ActionStatus."""

    dead_letter: Annotated[
        DeadLetterFacts | None,
        Meta(description="On a DLQ entry (state `dead_lettered`): the refused message."),
    ] = None


#: message_type → the extension object it carries.
EXTENSIONS: Final[dict[str, type[_Extension]]] = {
    "aip.core.v1.action": ActionExtension,
    "aip.core.v1.action_result": ResultExtension,
    "aip.core.v1.stream_chunk": ChunkExtension,
    "aip.core.v1.cancel": CancelExtension,
    "aip.core.v1.error": ErrorExtension,
    "aip.core.v1.escalation": EscalationExtension,
    "aip.core.v1.escalation_resolution": ResolutionExtension,
    "aip.lifecycle.v1.action_status": StatusExtension,
}

#: The message types whose Envelope always carries our extension (a worker writes them, and
#: their readers need its facts); on an Action it is optional.
ALWAYS_CARRIED: Final = frozenset(
    {
        "aip.core.v1.action_result",
        "aip.core.v1.stream_chunk",
        "aip.core.v1.escalation",
        "aip.core.v1.escalation_resolution",
        "aip.lifecycle.v1.action_status",
    }
)

#: Descriptions of the fields of the internal types the action extension reuses (they are
#: `schemas/action.py`'s, which carry none): def name → field → description.
REUSED_FIELD_DESCRIPTIONS: Final[dict[str, dict[str, str]]] = {
    "ApprovalRef": {"decision_id": "The durable approval decision's id."},
    "DelegationRef": {
        "delegation_id": "The delegation's id.",
        "parent_action_id": "The Action that delegated (null or absent: not known here).",
        "chain": "The validated delegation chain, root first, ending with the delegator.",
    },
}
