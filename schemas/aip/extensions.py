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

from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

from schemas.action import ApprovalRef, DelegationRef
from schemas.aip.result import ErrorCategory
from schemas.channel import (
    INGRESS_SESSION_PATTERN,
    MAX_INGRESS_CONTENT_BYTES,
    ChannelRole,
    ChannelSource,
)
from schemas.errors import ErrorCode
from schemas.ids import DLQ_ID_PATTERN, ActionId, EndpointId, ShortText, UnixMs
from schemas.lifecycle import AuthenticatedPrincipal

#: Our namespace in `Envelope.extensions` (reverse-DNS of the project name).
EXTENSION_KEY: Final = "org.aip-hermes-worker"

#: The sha256 of some exact bytes, as lowercase hex.
SHA256_PATTERN: Final = r"^[0-9a-f]{64}\Z"
Sha256Hex = Annotated[str, Meta(pattern=SHA256_PATTERN)]


class _Extension(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """A closed extension object: an unknown key is refused by its reader."""


class ChannelDeliveryFacts(_Extension, frozen=True):
    """The delivery record of a channel egress Action (docs/channels.md): which rule made
    it of which settled source. Only on `aip.hermes.{endpoint}.egress`; an Action on the
    actions subject that carries it is refused."""

    rule_id: Annotated[ShortText, Meta(description="The egress rule that made the delivery.")]
    source: Annotated[
        ChannelSource,
        Meta(description="What is delivered: an Action's `result` or the `escalation` it raised."),
    ]
    source_action_id: Annotated[
        ActionId, Meta(description="The Action whose settled result is the source.")
    ]
    source_id: Annotated[
        ShortText,
        Meta(description="The escalation id for an escalation, else the source Action id."),
    ]


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
    delegation: Annotated[
        DelegationRef | None,
        Meta(description="The delegation this Action is a child of."),
    ] = None
    channel_delivery: Annotated[
        ChannelDeliveryFacts | None,
        Meta(
            description="Only on the egress queue `aip.hermes.{endpoint}.egress`, where the "
            "Action is a channel delivery (`session_chat` into a persisted session, signed by "
            "a worker key): the rule and source it was made of. Refused on the actions subject."
        ),
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


class RetryPolicyFacts(_Extension, frozen=True):
    """The retry policy a worker applied to an Action, in the reference runtime's terms
    (`ActionStatus.retry.policy`): attempts include the first; backoff grows by
    `backoff_multiplier` from `initial_backoff_ms` up to `max_backoff_ms`, each delay drawn
    between half of it and all of it (jitter)."""

    max_attempts: Annotated[int, Meta(ge=1, description="Attempts allowed, the first included.")]
    initial_backoff_ms: Annotated[int, Meta(ge=0, description="The first retry's backoff (ms).")]
    max_backoff_ms: Annotated[int, Meta(ge=0, description="The longest backoff (ms).")]
    backoff_multiplier: Annotated[
        int, Meta(ge=1, description="What each further backoff is multiplied by.")
    ]


class RetryExhausted(_Extension, frozen=True):
    """A failed result whose worker retry policy was spent: every attempt it allowed was
    made and failed retryably (`worker/operations/retry.py`). The worker's DLQ entry for the
    Action (`ActionStatus.retry`) is made from these facts, so a republish makes the same."""

    attempts: Annotated[
        int, Meta(ge=1, description="Requests sent to Hermes for the Action, the first included.")
    ]
    policy: Annotated[RetryPolicyFacts, Meta(description="The policy that was spent.")]


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
    retry_exhausted: Annotated[
        RetryExhausted | None,
        Meta(
            description="Only on a failed result whose worker retry policy was spent (a read "
            "that kept failing retryably): the attempts made and the policy. The Action also "
            "has a DLQ entry (state `dead_lettered`) saying the same."
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


class HermesMessageFacts(_Extension, frozen=True):
    """`ChannelMessage.message` (a free AIP slot) on `aip.hermes.{endpoint}.inbound.{session}`:
    the Hermes message's own facts."""

    id: Annotated[
        int,
        Meta(ge=0, description="Hermes' message id (autoincrement of its state.db): the "
        "follow cursor, unique per Hermes server."),
    ]
    role: Annotated[ChannelRole, Meta(description="The Hermes role of the message.")]
    timestamp: Annotated[
        float | None, Meta(description="Hermes' message time (epoch seconds), when it has one.")
    ] = None
    finish_reason: Annotated[
        ShortText | None, Meta(description="Hermes' finish reason, when it reports one.")
    ] = None
    tool_name: Annotated[
        ShortText | None, Meta(description="The tool that produced a `tool` message.")
    ] = None
    tool_call_id: Annotated[
        ShortText | None,
        Meta(description="The tool call a `tool` message answers (also its part's id)."),
    ] = None


class IngressDeliveryFacts(_Extension, frozen=True):
    """`ChannelMessage.delivery` (a free AIP slot) on the inbound subject: how the follower
    delivered the content."""

    content_bytes: Annotated[
        int, Meta(ge=0, description="Size in UTF-8 bytes of the content Hermes returned.")
    ]
    content_truncated: Annotated[
        bool,
        Meta(
            description=f"True when the content was cut at {MAX_INGRESS_CONTENT_BYTES} bytes "
            "(the part holds the cut text)."
        ),
    ]
    dedupe_id: Annotated[
        str,
        Meta(
            max_length=512,
            description="`{endpoint}:{message id}`: the `Nats-Msg-Id` it was published under.",
        ),
    ]


class HermesChannel(_Extension, frozen=True):
    """`Conversation.channel` (a free AIP slot) of a followed Hermes session."""

    system: Annotated[str, Meta(description="Always `hermes-agent`.")]
    endpoint_id: Annotated[EndpointId, Meta(description="The Hermes endpoint of the session.")]
    session_id: Annotated[
        str,
        Meta(pattern=INGRESS_SESSION_PATTERN, description="The followed Hermes session's id."),
    ]


class ChildFacts(_Extension, frozen=True):
    """The delegated child Action's facts with no AIP field (as `ActionExtension` carries
    them for an Action of its own; its delegation contract is the DelegationRequest)."""

    created_at_unix_ms: Annotated[
        UnixMs | None,
        Meta(description="When the child Action was created (Unix ms); absent: `sent_at`."),
    ] = None
    deadline_unix_ms: Annotated[
        UnixMs | None,
        Meta(description="The child's absolute deadline (Unix ms), when it has one."),
    ] = None


class DelegationExtension(_Extension, frozen=True):
    """What an `aip.agent.v1.delegation_request` Envelope carries beyond the AIP
    DelegationRequest (the requested scopes are `metadata.scopes`, an AIP open slot)."""

    created_at_unix_ms: Annotated[
        UnixMs | None,
        Meta(
            description="When the delegation was requested (Unix ms); absent: the "
            "Envelope's `sent_at` is taken."
        ),
    ] = None
    deadline_unix_ms: Annotated[
        UnixMs | None,
        Meta(description="Absolute deadline (Unix ms) after which the delegation is not started."),
    ] = None
    approval: Annotated[
        ApprovalRef | None,
        Meta(
            description="A pointer to the durable approval decision of the exact child "
            "(never authority by itself: the worker reads the record)."
        ),
    ] = None
    child: Annotated[
        ChildFacts | None,
        Meta(description="The child Action's own facts with no AIP field."),
    ] = None


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
    """What an `aip.lifecycle.v1.action_status` Envelope carries beyond the AIP ActionStatus.
    Two writers use the type: the gateway's runtime records (`record`: which store, and the
    internal authorization context AIP has no field for; the delegation resolver checks it)
    and the workers' DLQ entries (`dead_letter`). Each reader requires its own part
    (`worker/wire/runtime_records.py`, `worker/wire/dead_letters.py`)."""

    record: Annotated[
        Literal["queue", "lifecycle"] | None,
        Meta(
            description="Runtime records: `queue`, the child's queue entry "
            "(`aip.runtime.queue.{id}`); `lifecycle`, its lifecycle record with the durable "
            "result (`aip.runtime.lifecycle.{id}`). Absent on a DLQ entry."
        ),
    ] = None
    updated_at_unix_ms: Annotated[
        UnixMs | None,
        Meta(
            description="Runtime records: when the record was written (Unix ms; also "
            "`updated_at`)."
        ),
    ] = None
    action: Annotated[
        dict[str, Any] | None,
        Meta(
            description="Queue records: the child Action exactly as enqueued, as an AIP "
            "Action object (`aip.core.v1.action`'s `body.action`, identity included)."
        ),
    ] = None
    action_facts: Annotated[
        ActionExtension | None,
        Meta(
            description="Queue records: the child's facts with no AIP field, as an Action "
            "Envelope's extension carries them (its delegation contract included)."
        ),
    ] = None
    owner_principal_id: Annotated[
        str | None, Meta(description="Queue records: the principal that owns the entry.")
    ] = None
    actor_principal_id: Annotated[
        str | None, Meta(description="Queue records: the actor the child executes under.")
    ] = None
    authenticated: Annotated[
        AuthenticatedPrincipal | None,
        Meta(
            description="Queue records: who the MCP transport authenticated when the child "
            "was created (never from a payload)."
        ),
    ] = None
    tenant_partition: Annotated[
        str | None, Meta(description="Queue records: the tenant partition of the entry.")
    ] = None
    enqueued_at_unix_ms: Annotated[
        UnixMs | None,
        Meta(
            description="Queue records: when the runtime accepted the child (the "
            "authentication must be valid then)."
        ),
    ] = None
    capability: Annotated[
        str | None,
        Meta(description="Lifecycle records with a result: the child's capability id."),
    ] = None
    settled_at_unix_ms: Annotated[
        UnixMs | None,
        Meta(
            description="Lifecycle records with a result: when the child settled (Unix "
            "ms; also `completed_at`)."
        ),
    ] = None
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
    "aip.agent.v1.delegation_request": DelegationExtension,
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
    "AuthenticatedPrincipal": {
        "principal_id": "The authenticated principal's id.",
        "principal_kind": "Its kind word (`user`, `agent`, `service`, ...).",
        "tenant_id": "Its tenant, when it has one.",
        "authentication_issuer": "Who authenticated it.",
        "credential_revision": "The credential revision it authenticated with.",
        "scopes": "The scopes its token grants.",
        "expires_at_unix_ms": "When the authentication expires (Unix ms).",
        "tenant_expires_at_unix_ms": "When its tenant membership expires (Unix ms; "
        "absent: it does not).",
    },
    "ApprovalRef": {"decision_id": "The durable approval decision's id."},
    "DelegationRef": {
        "delegation_id": "The delegation's id.",
        "parent_action_id": "The Action that delegated (null or absent: not known here).",
        "chain": "The validated delegation chain, root first, ending with the delegator.",
    },
}
