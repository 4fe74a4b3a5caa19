"""The DLQ subject's wire: a refused message kept as a signed AIP
`aip.lifecycle.v1.action_status` Envelope in state `dead_lettered`, and back
(docs/publishing.md "The dead-letter queue"; shared/reference/aip-1.0-wire.md §1.7, §7.13).

AIP has no DLQ message; its ActionStatus has the state (`dead_lettered` = parked in a DLQ)
and nothing else a DLQ entry needs, so:

- `action_id` is the refused Action's id when the worker authenticated it, and otherwise the
  entry's own `dlq_…` id: an id an unauthenticated message merely claims is never written
  where a reader would take it as that Action's state (the same rule as its receipts);
- the reason code and category, the source subject and sequence, the refusing worker, the
  refused bytes' size and sha256, and their first `AIPD_DLQ_KEEP_BYTES` (base64, what `dlq
  replay` republishes) are `extensions["org.aip-hermes-worker"].dead_letter`. ActionStatus
  types an error only inside `result`, and a dead-lettered Action has no result: a reader
  would take one there for the Action's outcome;
- an Action whose worker retry policy was spent (`worker/pipeline/exhausted.py`) is no
  refused message: its entry also has `capability_id`, `result_status: failed` and the
  reference runtime's `ActionStatus.retry` (`attempts`, `policy`, `last_error` as an AIP
  ProtocolError, `dead_letter_reason`), and its facts keep the Action's own Envelope (what
  `dlq replay` republishes under a new id). Its one failed result is on the results
  subject as for any failure.

The worker signs the Envelope with its response key (AIP signature), so the kept bytes, the
reason and the hash are vouched for together; `message_id` is `msg_` + the entry id's hex.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from schemas.aip.extensions import DeadLetterFacts, StatusExtension
from schemas.aip.lifecycle import ActionState
from schemas.aip.lifecycle import ActionStatus as AipActionStatus
from schemas.aip.result import ErrorCategory
from schemas.errors import CODE_RULES, ErrorCode
from schemas.ids import is_dlq_id
from worker.aip.envelope import now_timestamp
from worker.aip.signing import AipSigner
from worker.wire.envelopes import (
    DEFAULT_MAX_ENVELOPE_BYTES,
    Opened,
    extension_as,
    invalid,
    open_envelope,
    open_payload,
    seal,
)
from worker.wire.results import worker_principal

STATUS_TYPE: Final = "aip.lifecycle.v1.action_status"
_TYPES: Final = frozenset({STATUS_TYPE})


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One DLQ entry as a reader sees it: the refused Action's id when it was authenticated
    (None: it never was), when the worker wrote the entry, and the entry's facts."""

    action_id: str | None
    recorded_at: str
    facts: DeadLetterFacts
    #: `ActionStatus.retry` of an entry for a spent retry policy (None: a refused message).
    retry: dict[str, Any] | None = None

    @property
    def dlq_id(self) -> str:
        return self.facts.dlq_id

    @property
    def whole(self) -> bool:
        """Whether `facts.kept` is the whole refused message (so it can be replayed)."""
        return len(self.facts.kept) == self.facts.size


def dead_letter_facts(
    *,
    dlq_id: str,
    endpoint_id: str,
    code: ErrorCode,
    reason: str,
    subject: str,
    stream_seq: int,
    worker_id: str,
    payload: bytes,
    keep_bytes: int,
) -> DeadLetterFacts:
    """The facts of one refusal: `payload`'s size and sha256, and its first `keep_bytes`."""
    return DeadLetterFacts(
        dlq_id=dlq_id,
        endpoint_id=endpoint_id,
        code=code,
        category=ErrorCategory(CODE_RULES[code].category.value),
        reason=reason,
        subject=subject,
        stream_seq=stream_seq,
        worker_id=worker_id,
        size=len(payload),
        sha256=hashlib.sha256(payload).hexdigest(),
        kept=payload[:keep_bytes],
    )


def encode_dead_letter(
    facts: DeadLetterFacts,
    *,
    action_id: str | None,
    signer: AipSigner | None,
    status: Mapping[str, Any] | None = None,
) -> bytes:
    """The wire bytes of one DLQ entry: an `action_status` Envelope (state `dead_lettered`)
    from the refusing worker, signed by `signer` (None: unsigned, development only).
    `status`: further ActionStatus fields (an exhausted retry policy's `retry`, …)."""
    return seal(
        STATUS_TYPE,
        {
            **(status or {}),
            "action_id": action_id if action_id is not None else facts.dlq_id,
            "state": ActionState.DEAD_LETTERED.value,
            "updated_at": now_timestamp(),
        },
        sender=worker_principal(facts.endpoint_id),
        signer=signer,
        extension={"dead_letter": msgspec.to_builtins(facts)},
        message_id="msg_" + facts.dlq_id.removeprefix("dlq_"),
    )


def decode_dead_letter(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
) -> tuple[DeadLetter, Opened]:
    """The DLQ entry in `data` and its Envelope (signature, if any, verified: whom to trust
    is the caller's decision). EnvelopeRejected for anything else: not an `action_status`
    Envelope, a state other than `dead_lettered`, no `dead_letter` facts, a `message_id`
    that is not the entry id's, or facts that contradict themselves (a sha256 or size the
    kept bytes cannot have)."""
    opened = open_envelope(data, message_types=_TYPES, max_bytes=max_bytes)
    body = open_payload(opened, STATUS_TYPE)
    assert isinstance(body, AipActionStatus)
    if body.state is not ActionState.DEAD_LETTERED:
        raise invalid(f"action_status: state {body.state.value} is not dead_lettered")
    facts = extension_as(opened, StatusExtension).dead_letter
    if facts is None:
        raise invalid("action_status: no dead_letter facts in our extension")
    if opened.message_id != "msg_" + facts.dlq_id.removeprefix("dlq_"):
        raise invalid("action_status: message_id is not the DLQ entry's")
    if len(facts.kept) > facts.size:
        raise invalid("dead_letter: more bytes kept than the message had")
    if len(facts.kept) == facts.size and hashlib.sha256(facts.kept).hexdigest() != facts.sha256:
        raise invalid("dead_letter: the kept bytes do not have the sha256 named")
    sender = opened.sender
    if sender is None or sender.get("id") != worker_principal(facts.endpoint_id)["id"]:
        raise invalid("action_status: not from the endpoint's worker")
    claimed = body.action_id
    action_id = None if claimed == facts.dlq_id or is_dlq_id(claimed) else claimed
    retry = body.retry if isinstance(body.retry, dict) else None
    return (
        DeadLetter(action_id=action_id, recorded_at=body.updated_at, facts=facts, retry=retry),
        opened,
    )


__all__ = [
    "STATUS_TYPE",
    "DeadLetter",
    "dead_letter_facts",
    "decode_dead_letter",
    "encode_dead_letter",
]
