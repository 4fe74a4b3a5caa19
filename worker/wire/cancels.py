"""The cancel subject's wire: a signed AIP `aip.core.v1.cancel` Envelope in, and its answer
out (shared/reference/aip-1.0-wire.md §1.8, §7.6; docs/publishing.md "Cancel").

* **The request.** `body.cancel` = `{target: {action: "act_…"}, reason}`; the requester is
  the Envelope's `from` (its `id` is what the cancel authority checks,
  `worker.trust.cancel_authority`), vouched for by the signature of a trusted gateway key,
  which the caller checks (`Opened.verified`). A session target is refused: connector hosts
  cancel Actions only. Our extension may carry `wait_ms`, how long the requester waits.
* **The answer.** AIP has no cancel-reply type: a Cancel is answered by the Action's
  `action_result` (status `cancelled`, or the terminal result it had already reached), or
  by an `aip.core.v1.error` Envelope (a refusal, or a cancel not settled within the wait).
  Both follow the reply recipe (`ReplyRecipe.answering` the Cancel) and are signed by the
  worker's response key. What the worker found (`accepted`, `state`: the facts of the old
  CancelReply) travels in the error Envelope's extension (`ErrorExtension.cancel`).

Every failure to read is an `EnvelopeRejected` with the code the reply carries.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from schemas.aip.control import Cancel
from schemas.aip.extensions import CancelExtension, CancelFacts, ErrorExtension
from schemas.aip.result import ErrorBody
from schemas.errors import ProtocolError
from schemas.ids import ACTION_ID_PATTERN
from schemas.result import ActionResult, ResultStatus
from worker.aip.canonical import loads
from worker.aip.errors import AipWireError
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
from worker.wire.results import (
    RESULT_TYPE,
    decode_result,
    encode_result,
    error_from_aip,
    error_to_aip,
    worker_principal,
)

MESSAGE_TYPE: Final = "aip.core.v1.cancel"
ERROR_TYPE: Final = "aip.core.v1.error"
_TYPES: Final = frozenset({MESSAGE_TYPE})
_REPLY_TYPES: Final = frozenset({RESULT_TYPE, ERROR_TYPE})
#: The longest `reason` taken (the old CancelRequest's bound).
MAX_REASON_CHARS: Final = 1024
#: The longest requester id taken (the internal ShortText bound).
MAX_REQUESTER_CHARS: Final = 512

_PRINCIPAL_KINDS_BY_PREFIX: Final = {"user": "human", "agent": "agent", "service": "service"}



def requester_principal(principal_id: str, kind: str | None = None) -> dict[str, str]:
    """The `from` Principal a gateway signs a Cancel as, for the requester `principal_id`.
    Without a `kind`, it is read from the id's prefix (`user:` human, `agent:` agent,
    otherwise service); the worker authorizes by the id alone."""
    if kind is None:
        kind = _PRINCIPAL_KINDS_BY_PREFIX.get(principal_id.partition(":")[0], "service")
    return {"id": principal_id, "kind": kind}


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """A Cancel as the worker acts on it."""

    action_id: str
    reason: str
    #: `from.id`: the principal the cancel authority checks.
    requested_by: str
    #: How long the requester waits for the answer (ms), when it said.
    wait_ms: int | None
    opened: Opened


def encode_cancel(
    action_id: str,
    *,
    requester: Mapping[str, Any],
    signer: AipSigner | None,
    reason: str = "",
    wait_ms: int | None = None,
    correlation_id: str | None = None,
    message_id: str | None = None,
    sent_at: str | None = None,
) -> bytes:
    """The wire bytes of a Cancel of `action_id`, signed by `signer` (the gateway key; None:
    unsigned, development only) as `requester` (a Principal `{id, kind}`).

    EnvelopeRejected (`schema.envelope.invalid`) for a Cancel the workers would refuse."""
    payload: dict[str, Any] = {"target": {"action": action_id}}
    if reason:
        payload["reason"] = reason
    extension = {"wait_ms": wait_ms} if wait_ms is not None else None
    try:
        data = seal(
            MESSAGE_TYPE,
            payload,
            sender=requester,
            signer=signer,
            correlation_id=correlation_id,
            extension=extension,
            message_id=message_id,
            sent_at=sent_at,
        )
    except AipWireError as exc:
        raise invalid(f"the Cancel cannot be sealed: {exc}") from None
    cancel_of(open_cancel(data))
    return data


def sign_cancel_envelope(
    data: bytes, *, signer: AipSigner, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
) -> bytes:
    """A Cancel Envelope (signed or not) signed again by `signer`, keeping its
    `message_id`, `sent_at`, correlation and requester (`from` `{id, kind}`): what
    `aip-hermes-worker sign --kind cancel` prints. EnvelopeRejected when `data` is not a
    Cancel the workers decode."""
    request = decode_cancel(data, max_bytes=max_bytes)
    envelope = request.opened.envelope
    sender = request.opened.sender or {}
    correlation_id = envelope.get("correlation_id")
    return encode_cancel(
        request.action_id,
        requester={key: value for key, value in sender.items() if key in ("id", "kind")},
        signer=signer,
        reason=request.reason,
        wait_ms=request.wait_ms,
        correlation_id=correlation_id if isinstance(correlation_id, str) else None,
        message_id=request.opened.message_id,
        sent_at=str(envelope["sent_at"]),
    )


def open_cancel(data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES) -> Opened:
    """The frame of a Cancel Envelope (EnvelopeRejected: not one, or a signature present
    that does not verify). Its reply recipe is known from here on."""
    return open_envelope(data, message_types=_TYPES, max_bytes=max_bytes)


def cancel_of(opened: Opened) -> CancelRequest:
    """The Cancel an opened Envelope carries; EnvelopeRejected (`schema.envelope.invalid`)
    for a body, target, requester or extension the cancel subject does not take."""
    cancel = open_payload(opened, MESSAGE_TYPE)
    assert isinstance(cancel, Cancel)
    action_id = cancel.target.action
    if action_id is None:
        raise invalid("cancel.target must name an action (a session cannot be cancelled here)")
    if re.fullmatch(ACTION_ID_PATTERN, action_id) is None:
        raise invalid(f"cancel.target.action is not an Action id ({ACTION_ID_PATTERN})")
    reason = cancel.reason or ""
    if len(reason) > MAX_REASON_CHARS:
        raise invalid(f"cancel.reason is over {MAX_REASON_CHARS} characters")
    sender = opened.sender
    requested_by = sender.get("id") if sender is not None else None
    if not isinstance(requested_by, str) or not requested_by:
        raise invalid("a Cancel names its requester in `from`")
    if len(requested_by) > MAX_REQUESTER_CHARS:
        raise invalid(f"from.id is over {MAX_REQUESTER_CHARS} characters")
    extension = extension_as(opened, CancelExtension)
    return CancelRequest(
        action_id=action_id,
        reason=reason,
        requested_by=requested_by,
        wait_ms=extension.wait_ms,
        opened=opened,
    )


def claimed_reply(data: bytes) -> ReplyRecipe:
    """The reply recipe a request that could not be opened *claims* (its `message_id`,
    `from` and `correlation_id`, trusting nothing), so even a refusal names what it answers;
    an empty recipe when it claims none. The answer's sealing checks what it echoes."""
    try:
        envelope = loads(data)
    except AipWireError:
        return ReplyRecipe()
    if not isinstance(envelope, dict):
        return ReplyRecipe()
    message_id, sender, correlation_id = (
        envelope.get(name) for name in ("message_id", "from", "correlation_id")
    )
    return ReplyRecipe(
        in_response_to=message_id if isinstance(message_id, str) else None,
        to=sender if isinstance(sender, dict) else None,
        correlation_id=correlation_id if isinstance(correlation_id, str) else None,
    )


def decode_cancel(data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES) -> CancelRequest:
    """`open_cancel` and `cancel_of` in one (EnvelopeRejected)."""
    return cancel_of(open_cancel(data, max_bytes=max_bytes))


# --- the notice among workers -------------------------------------------------------------

#: The `reason` of a relayed cancel notice.
NOTICE_REASON: Final = "cancel intent recorded: re-read it"
#: The largest notice a worker reads (a worker-signed notice is about 700 bytes).
MAX_NOTICE_BYTES: Final = 4096


def encode_cancel_notice(
    action_id: str, *, endpoint_id: str, signer: AipSigner | None, correlation_id: str | None
) -> bytes:
    """The notice a worker publishes on `…control.cancel` once a cancel intent is durable: a
    Cancel of `action_id` from the endpoint's worker principal, signed by the worker's
    response key, correlated with the request it relays. It wakes the worker holding the
    Action to re-read the recorded intent (`worker.execution.cancel_notices`); the notice
    itself grants nothing."""
    return encode_cancel(
        action_id,
        requester=worker_principal(endpoint_id),
        signer=signer,
        reason=NOTICE_REASON,
        correlation_id=correlation_id,
    )


class _NoticeTarget(msgspec.Struct, frozen=True):
    action: str | None = None


class _NoticeCancel(msgspec.Struct, frozen=True):
    target: _NoticeTarget


class _NoticeBody(msgspec.Struct, frozen=True):
    cancel: _NoticeCancel


class _Notice(msgspec.Struct, frozen=True):
    """The part of a notice a worker reads: the Envelope's type and the Cancel's target."""

    aip_version: str
    message_type: str
    body: _NoticeBody


_NOTICE_DECODER: Final = msgspec.json.Decoder(_Notice)


def notice_action_id(data: bytes) -> str:
    """The Action a cancel notice names. Neither its signature nor its whole schema is
    checked, on purpose: a notice only asks for a re-read of the durable intent, so a forged
    one costs one coalesced Redis read, and a flood must not cost a signature check or a
    full Envelope validation each (a typed read of three fields is a few microseconds).
    EnvelopeRejected for anything that is not a Cancel Envelope naming an Action."""
    if len(data) > MAX_NOTICE_BYTES:
        raise invalid(f"a cancel notice is at most {MAX_NOTICE_BYTES} bytes")
    try:
        notice = _NOTICE_DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise invalid(f"not a cancel notice: {exc}") from None
    except msgspec.DecodeError:
        raise invalid("a cancel notice is a JSON Envelope") from None
    action_id = notice.body.cancel.target.action
    if notice.message_type != MESSAGE_TYPE or action_id is None:
        raise invalid("a cancel notice is a Cancel of an Action")
    if re.fullmatch(ACTION_ID_PATTERN, action_id) is None:
        raise invalid(f"cancel.target.action is not an Action id ({ACTION_ID_PATTERN})")
    return action_id


# --- the answer ------------------------------------------------------------------------------


def encode_cancel_result(
    result: ActionResult,
    *,
    reply: ReplyRecipe,
    signer: AipSigner | None,
    endpoint_id: str,
    cancel: CancelFacts,
) -> bytes:
    """The answer that the Action ended: its result, as an `action_result` Envelope
    answering the Cancel, with what the worker found in our extension (`cancel`)."""
    return encode_result(
        result, action=None, signer=signer, endpoint_id=endpoint_id, reply=reply, cancel=cancel
    )


def encode_error(
    error: ProtocolError,
    *,
    reply: ReplyRecipe,
    signer: AipSigner | None,
    endpoint_id: str,
    action_id: str | None,
    cancel: CancelFacts | None = None,
) -> bytes:
    """An `aip.core.v1.error` Envelope (`body.error.error` = the ProtocolError) answering
    the request `reply` names, from the worker, with what it found in our extension. A
    recipe that cannot be echoed (a claimed `from` that is no Principal) is left out."""
    extension = {
        name: value
        for name, value in msgspec.to_builtins(
            ErrorExtension(action_id=action_id, endpoint_id=endpoint_id, cancel=cancel)
        ).items()
        if value is not None
    }
    try:
        return seal(
            ERROR_TYPE,
            {"error": error_to_aip(error)},
            sender=worker_principal(endpoint_id),
            signer=signer,
            to=reply.to,
            in_response_to=reply.in_response_to,
            correlation_id=reply.correlation_id,
            extension=extension,
        )
    except AipWireError:
        if reply == ReplyRecipe():
            raise
        return encode_error(
            error,
            reply=ReplyRecipe(),
            signer=signer,
            endpoint_id=endpoint_id,
            action_id=action_id,
            cancel=cancel,
        )


@dataclass(frozen=True, slots=True)
class CancelOutcome:
    """A worker's answer to a Cancel, as the requester reads it.

    `result` is the Action's terminal result (the cancel settled it, or it had ended
    before); otherwise `error` says why not. `accepted`/`state` are what the worker found
    when it took the Cancel (the answer's extension; on a result that has none, as another
    implementation may send: whether it is `cancelled`, and `settled`)."""

    action_id: str | None
    accepted: bool
    state: str
    result: ActionResult | None = None
    error: ProtocolError | None = None
    #: The answer's AIP body as it arrived: `{"action_result": …}` (an AIP ActionResult)
    #: or `{"error": …}` (an AIP ErrorBody); what any AIP reader of the answer gets.
    answer: dict[str, Any] | None = None

    def to_builtins(self) -> dict[str, Any]:
        """What `aip-hermes-worker cancel` prints: the worker's findings and the answer's
        AIP body (`answer`), never the project's own result form."""
        out: dict[str, Any] = {
            "action_id": self.action_id,
            "accepted": self.accepted,
            "state": self.state,
        }
        if self.answer is not None:
            out["answer"] = self.answer
        return out


def _answer_body(opened: Opened) -> dict[str, Any] | None:
    body = opened.envelope.get("body")
    return dict(body) if isinstance(body, dict) else None


def decode_cancel_reply(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
) -> tuple[CancelOutcome, Opened]:
    """The answer in `data` and its Envelope (whose signature, if any, verified: which keys
    to trust is the caller's, `Opened.verified.did`). EnvelopeRejected when it is neither
    an `action_result` nor an `error` Envelope of ours."""
    opened = open_envelope(data, message_types=_REPLY_TYPES, max_bytes=max_bytes)
    if opened.message_type == RESULT_TYPE:
        result, opened = decode_result(data, max_bytes=max_bytes)
        found = opened.extension.get("cancel")
        try:
            facts = msgspec.convert(found, CancelFacts, strict=True) if found else None
        except msgspec.ValidationError as exc:
            raise invalid(f"extensions.cancel: {exc}") from None
        return (
            CancelOutcome(
                action_id=result.action_id,
                accepted=(
                    facts.accepted if facts else result.status is ResultStatus.CANCELLED
                ),
                state=facts.state if facts else "settled",
                result=result,
                answer=_answer_body(opened),
            ),
            opened,
        )
    body = open_payload(opened, ERROR_TYPE)
    extension = extension_as(opened, ErrorExtension)
    assert isinstance(body, ErrorBody)
    facts = extension.cancel
    return (
        CancelOutcome(
            action_id=extension.action_id,
            accepted=facts.accepted if facts is not None else False,
            state=facts.state if facts is not None else "unknown",
            error=error_from_aip(body.error),
            answer=_answer_body(opened),
        ),
        opened,
    )


__all__ = [
    "ERROR_TYPE",
    "MESSAGE_TYPE",
    "CancelOutcome",
    "CancelRequest",
    "cancel_of",
    "claimed_reply",
    "decode_cancel",
    "decode_cancel_reply",
    "encode_cancel",
    "encode_cancel_result",
    "encode_error",
    "open_cancel",
    "requester_principal",
    "sign_cancel_envelope",
]
