"""ActionResult: the one terminal answer per Action, settled under a lease fence.

The in-process type; on the results subject it travels as a signed AIP
`aip.core.v1.action_result` Envelope (`worker/wire/results.py`)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from schemas._base import WireStruct
from schemas.aip.extensions import RetryExhausted
from schemas.errors import ProtocolError
from schemas.ids import ActionId, UnixMs


class ResultStatus(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REQUIRES_HUMAN = "requires_human"


class ActionResult(WireStruct, kw_only=True, frozen=True):
    action_id: ActionId
    capability: str
    endpoint_id: str
    status: ResultStatus
    output: Any = None
    error: ProtocolError | None = None
    #: The worker whose fenced settle wrote this result.
    settled_by: str
    #: The lease fence that settle held; a higher fence never sees a lower one overwrite it.
    fence: int
    settled_at_unix_ms: UnixMs
    #: sha256 (hex) of the exact bytes of the Action's last (terminal) chunk Envelope: the
    #: result Envelope's AIP signature thereby covers the whole chunk chain.
    last_chunk_sha256: str | None = None
    #: sha256 (hex) of the exact bytes of the Action envelope this result answers (the
    #: message the worker decoded, then executed or refused). Under the result's signature it
    #: binds the answer to one envelope: a genuinely signed result of another Action, or of
    #: another envelope under the same id, copied onto this results subject, is refused by
    #: the gateway and by `AipClient`, which know the bytes they published.
    action_sha256: str | None = None
    #: Set when this result is another Action's, returned because this Action carried the
    #: same `idempotency_key` for the same capability, tenant and principal within the
    #: key's TTL (AIP `collision_behavior: return_original_result`): the id of the Action
    #: that ran. Status, output and error are that Action's; nothing was sent to Hermes for
    #: this one (docs/guarantees.md "Idempotency keys").
    original_action_id: ActionId | None = None
    #: Set only on a failed result whose worker retry policy was spent (every attempt it
    #: allowed failed retryably, `worker/operations/retry.py`): the attempts and the policy.
    #: The Outbox dead-letters such an Action with them (`worker/pipeline/exhausted.py`).
    retry_exhausted: RetryExhausted | None = None
