"""Receipt: one redacted decision record on `aip.hermes.{endpoint}.audit`.

Receipts let an operator reconstruct what happened to an Action without trusting any one
process. They are redacted by construction: `details` holds only scalars chosen by the
emitting code (input appears only as a fingerprint, never a body, header value or key).

On the wire (`worker/wire/receipts.py`) each receipt is an AIP Receipt in an
`aip.audit.v1.receipt_chain` Envelope, these fields its `data`. A worker signs receipts in
segments (worker/bus/audit.py): the receipts one process sends about one Action back to
back each name the AIP hash of the one before (`prev_sha256`, the Receipt's
`previous_hash`), and the Envelope of the segment's last receipt is AIP-signed, so one
Ed25519 signature vouches for the whole segment. `audit` believes a receipt that a trusted
worker signed or that a signed receipt links back to.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import msgspec

from schemas._base import WireStruct
from schemas.ids import UnixMs

DetailValue = str | int | float | bool | None


class ReceiptEvent(StrEnum):
    RECEIVED = "received"
    #: Identity, tenant and approval checks passed: who the Action runs for, and who approved.
    ADMITTED = "admitted"
    REFUSED = "refused"
    DEAD_LETTERED = "dead_lettered"
    LEASE_ACQUIRED = "lease_acquired"
    LEASE_LOST = "lease_lost"
    LEASE_RELEASED = "lease_released"
    DUPLICATE = "duplicate"
    START_CLAIMED = "start_claimed"
    PROVIDER_REQUEST = "provider_request"
    RUN_BOUND = "run_bound"
    APPROVAL_COMMAND = "approval_command"
    CANCEL_REQUESTED = "cancel_requested"
    #: A cancel request refused (unknown requester, or not allowed to cancel this Action).
    CANCEL_REFUSED = "cancel_refused"
    CANCEL_SENT = "cancel_sent"
    CANCEL_CONFIRMED = "cancel_confirmed"
    SETTLED = "settled"
    FENCED_OUT = "fenced_out"
    REPUBLISHED = "republished"
    #: The AIP gateway answered one MCP tool call (details: tool, principal, decision).
    TOOL_CALL = "tool_call"
    #: Closes a segment of a worker's receipts about one Action: signed, naming the last one
    #: (`prev_sha256`), so every receipt of the segment is verified through it.
    SEGMENT_SEALED = "segment_sealed"
    #: A person replayed a DLQ entry (`dlq replay`), under the entry's own id: details name
    #: the new Action id it was published under, who and why; signed by the gateway key that
    #: signed the replay.
    DLQ_REPLAYED = "dlq_replayed"
    #: A person removed a DLQ entry without replaying it (`dlq discard`): who and why.
    DLQ_DISCARDED = "dlq_discarded"
    #: An authority member opened the sealed command behind an approval prompt
    #: (`escalations show --reveal`), in the source Action's chain; signed by that member.
    COMMAND_REVEALED = "command_revealed"


class Receipt(WireStruct, kw_only=True, frozen=True):
    #: Unique and deterministic per decision: also the `Nats-Msg-Id`, so a retried publish of
    #: the same receipt is dropped by the server.
    receipt_id: Annotated[str, msgspec.Meta(max_length=256)]
    event: ReceiptEvent
    #: The Action the decision is about; for an envelope that failed authentication, its DLQ
    #: entry's id (`dlq_…`), so an unauthenticated envelope never appends to an Action's chain.
    action_id: str
    endpoint_id: str
    worker_id: str
    fence: int = 0
    trace_id: str | None = None
    ts_unix_ms: UnixMs
    details: dict[str, DetailValue] = msgspec.field(default_factory=dict)
    #: The AIP `hash` of the receipt this worker published just before this one about the
    #: same Action, in the same signed segment (its `previous_hash`); None opens a segment.
    prev_sha256: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}\Z")] | None = None
