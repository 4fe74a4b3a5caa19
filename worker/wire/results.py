"""The results subject's wire: an internal `ActionResult` as a signed AIP
`aip.core.v1.action_result` Envelope, and back (docs/publishing.md "ActionResult").

The AIP body carries what AIP has a field for (`action_id`, `status`, `output`, `error`);
the facts only this project has (who settled it under which fence, when, the hash of the
last chunk and of the Action envelope answered…) travel in our extension, under the same
signature. The Envelope follows the AIP reply recipe (aip-1.0-wire.md §2.6): `in_response_to`
is the Action Envelope's `message_id`, `to` its sender, `correlation_id` copied; `from` is
the worker's Principal, and the signature is the worker's response key.

An error maps to AIP's ProtocolError (§1.4, §7.4): `uncertain_outcome`, `remote_status`
and `endpoint_id` move into `details`, the message is cut to 1024 bytes (what connector
hosts keep), and `source` names this connector.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from schemas.action import Action
from schemas.aip.extensions import CancelFacts, ResultExtension
from schemas.aip.messages import open_body
from schemas.aip.result import ActionResult as AipActionResult
from schemas.aip.result import ProtocolError as AipProtocolError
from schemas.errors import (
    ErrorCategory,
    ErrorCode,
    ProtocolError,
)
from schemas.result import ActionResult
from worker.aip import canonical
from worker.aip.signing import AipSigner
from worker.wire.envelopes import (
    DEFAULT_MAX_ENVELOPE_BYTES,
    Opened,
    ReplyRecipe,
    extension_as,
    invalid,
    open_envelope,
    open_payload,
    seal,
)

RESULT_TYPE: Final = "aip.core.v1.action_result"
_TYPES: Final = frozenset({RESULT_TYPE})
#: The longest error message, in UTF-8 bytes, an AIP connector host passes on (§1.4).
MESSAGE_MAX_BYTES: Final = 1024
#: `ProtocolError.source` of every error this worker reports.
ERROR_SOURCE: Final = {"connector": "hermes-agent", "component": "aip-hermes-worker"}


def worker_principal(endpoint_id: str) -> dict[str, str]:
    """The Principal a worker answers as for one endpoint (upstream's operator agent id)."""
    return {"id": f"agent:hermes_operator:{endpoint_id}", "kind": "agent"}


class _ErrorDetails(msgspec.Struct, kw_only=True, frozen=True):
    """What `ProtocolError.details` holds of ours (other keys are left to their authors)."""

    uncertain_outcome: bool = False
    remote_status: int | None = None
    endpoint_id: str | None = None


def truncate_message(message: str, max_bytes: int = MESSAGE_MAX_BYTES) -> str:
    """`message` cut to at most `max_bytes` UTF-8 bytes, on a character boundary."""
    encoded = message.encode("utf-8")
    if len(encoded) <= max_bytes:
        return message
    return encoded[:max_bytes].decode("utf-8", errors="ignore")


def as_sent(error: ProtocolError) -> ProtocolError:
    """`error` as a result carries it (its message cut to `MESSAGE_MAX_BYTES`): what a
    settle keeps in process, so the outputs it feeds (an escalation, a channel delivery)
    and the terminal chunk say what the stored result says, on a republish too."""
    message = truncate_message(error.message)
    return error if message == error.message else msgspec.structs.replace(error, message=message)


def error_to_aip(error: ProtocolError) -> dict[str, Any]:
    """An internal ProtocolError in AIP's serialized form (absent optionals omitted)."""
    details: dict[str, Any] = {"uncertain_outcome": error.uncertain_outcome}
    if error.remote_status is not None:
        details["remote_status"] = error.remote_status
    if error.endpoint_id is not None:
        details["endpoint_id"] = error.endpoint_id
    return {
        "code": error.code.value,
        "message": truncate_message(error.message),
        "category": error.category.value,
        "retryable": error.retryable,
        "details": details,
        "source": dict(ERROR_SOURCE),
    }


def error_from_aip(error: AipProtocolError) -> ProtocolError:
    """An AIP ProtocolError as ours; EnvelopeRejected (`schema.envelope.invalid`) when it
    names a code or category this connector does not have, or malformed details."""
    try:
        code = ErrorCode(error.code)
    except ValueError:
        raise invalid(f"error code {error.code[:80]!r} is not one this connector emits") from None
    try:
        category = ErrorCategory(error.category.value)
    except ValueError:
        raise invalid(f"error category {error.category.value!r} is not one of ours") from None
    details = error.details if error.details is not None else {}
    try:
        ours = msgspec.convert(details, _ErrorDetails, strict=True)
    except msgspec.ValidationError as exc:
        raise invalid(f"error.details: {exc}") from None
    return ProtocolError(
        code=code,
        category=category,
        retryable=bool(error.retryable),
        uncertain_outcome=ours.uncertain_outcome,
        message=error.message,
        endpoint_id=ours.endpoint_id,
        remote_status=ours.remote_status,
    )


def encode_result(
    result: ActionResult,
    *,
    action: Action | None,
    signer: AipSigner | None,
    endpoint_id: str,
    reply: ReplyRecipe | None = None,
    cancel: CancelFacts | None = None,
) -> bytes:
    """The wire bytes of `result`: an `action_result` Envelope, signed by `signer` (None:
    unsigned, development only), answering `action`'s Envelope when it is known, or the
    request `reply` names (a Cancel answered with the Action's result, with what the worker
    found, `cancel`)."""
    payload: dict[str, Any] = {"action_id": result.action_id, "status": result.status.value}
    if result.output is not None:
        payload["output"] = msgspec.to_builtins(result.output)
    if result.error is not None:
        payload["error"] = error_to_aip(result.error)
    extension = {
        name: value
        for name, value in msgspec.structs.asdict(
            ResultExtension(
                capability=result.capability,
                endpoint_id=result.endpoint_id,
                settled_by=result.settled_by,
                fence=result.fence,
                settled_at_unix_ms=result.settled_at_unix_ms,
                last_chunk_sha256=result.last_chunk_sha256,
                action_sha256=result.action_sha256,
                original_action_id=result.original_action_id,
            )
        ).items()
        if value is not None
    }
    if result.retry_exhausted is not None:
        extension["retry_exhausted"] = msgspec.to_builtins(result.retry_exhausted)
    if cancel is not None:
        extension["cancel"] = msgspec.to_builtins(cancel)
    if reply is None:
        received = action.received if action is not None else None
        trace = action.trace if action is not None else None
        reply = ReplyRecipe(
            in_response_to=received.message_id if received is not None else None,
            to=received.sender if received is not None else None,
            correlation_id=trace.correlation_id if trace is not None else None,
        )
    return seal(
        RESULT_TYPE,
        payload,
        sender=worker_principal(endpoint_id),
        signer=signer,
        to=reply.to,
        in_response_to=reply.in_response_to,
        correlation_id=reply.correlation_id,
        extension=extension,
    )


def decode_result(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES, verify: bool = True
) -> tuple[ActionResult, Opened]:
    """The internal result in `data` and the Envelope it came in (whose signature, if any,
    verified: which keys to trust is the caller's decision, `Opened.verified.did`).

    EnvelopeRejected for anything that is not an `action_result` Envelope carrying one of
    our results (`envelope.decode.invalid`, `schema.envelope.invalid`, or
    `connector_host.authentication` for a signature that does not verify).

    `verify=False`: a result read back from the workers' own store (see open_envelope)."""
    opened = open_envelope(data, message_types=_TYPES, max_bytes=max_bytes, verify=verify)
    body = open_payload(opened, RESULT_TYPE)
    assert isinstance(body, AipActionResult)
    extension = extension_as(opened, ResultExtension)
    error = error_from_aip(body.error) if body.error is not None else None
    try:
        result = msgspec.convert(
            {
                **{k: v for k, v in msgspec.structs.asdict(extension).items() if k != "cancel"},
                "action_id": body.action_id,
                "status": body.status.value,
                "output": body.output,
            },
            ActionResult,
            strict=True,
        )
    except msgspec.ValidationError as exc:
        raise invalid(f"action_result: {exc}") from None
    if error is not None:
        result = msgspec.structs.replace(result, error=error)
    return result, opened



__all__ = [
    "ERROR_SOURCE",
    "MESSAGE_MAX_BYTES",
    "RESULT_TYPE",
    "as_sent",
    "decode_result",
    "encode_result",
    "error_from_aip",
    "error_to_aip",
    "truncate_message",
    "worker_principal",
]


def aip_result_of(data: bytes) -> AipActionResult:
    """The AIP ActionResult (`body.action_result`) of result Envelope bytes already opened
    (`decode_result`), as AIP 1.0's own type (`schemas/aip/result.py`): what any AIP reader
    gets from them, none of the settle facts of our extension."""
    body = open_body(RESULT_TYPE, canonical.loads(data)["body"])
    assert isinstance(body, AipActionResult)
    return body
