"""Seal and open AIP 1.0 Envelopes on the project's subjects: the one place that builds an
Envelope's frame, signs it, bounds and parses received bytes, and turns an AIP wire failure
into the project's typed refusal.

What a message type carries is the business of its own module (`worker/wire/*.py`); this
one only frames it. Facts the AIP payload has no field for travel in the Envelope's
`extensions` under `EXTENSION_KEY` (shared/reference/aip-1.0-wire.md §1.0.3), covered by
the signature like everything else but `security.signature`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TypeVar

import msgspec

from schemas.aip._base import AipStruct
from schemas.aip.messages import open_body, open_signed_body
from schemas.errors import BodyError, EnvelopeRejected, ErrorCode
from worker import tracing
from worker.aip.canonical import canonical_bytes, loads
from worker.aip.envelope import AIP_VERSION, BODY_KEYS, check_envelope, now_timestamp
from worker.aip.errors import AipWireError, MalformedJson, SignatureError
from worker.aip.signing import AipSigner, VerifiedEnvelope, signed_bytes, verify_checked

T = TypeVar("T")

#: Our namespace in `Envelope.extensions`.
EXTENSION_KEY: Final = "org.aip-hermes-worker"
#: The largest Envelope a consumer parses unless told otherwise (as before the AIP wire).
DEFAULT_MAX_ENVELOPE_BYTES: Final = 1_048_576


def new_message_id() -> str:
    """`msg_` and a UUIDv7 as 32 lowercase hex digits (upstream's MessageId form): 48 bits
    of Unix milliseconds, the version and variant bits, and 74 random bits."""
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # RFC 4122 variant
    return f"msg_{value:032x}"


@dataclass(frozen=True, slots=True)
class Opened:
    """A received Envelope whose frame is valid: the whole Envelope (builtins, as parsed),
    its payload (the one value of `body`), and the signature check's outcome when it
    carried one (None: it carried no `security.signature`)."""

    envelope: dict[str, Any]
    payload: dict[str, Any]
    verified: VerifiedEnvelope | None

    @property
    def message_type(self) -> str:
        return str(self.envelope["message_type"])

    @property
    def message_id(self) -> str:
        return str(self.envelope["message_id"])

    @property
    def extension(self) -> dict[str, Any]:
        """Our facts in `extensions[EXTENSION_KEY]` ({} when there are none)."""
        return extension_of(self.envelope)

    @property
    def sender(self) -> Mapping[str, Any] | None:
        sender = self.envelope.get("from")
        return sender if isinstance(sender, Mapping) else None


@dataclass(frozen=True, slots=True)
class ReplyRecipe:
    """How an answer names the request it answers (aip-1.0-wire.md §2.6): `in_response_to`
    its `message_id`, `to` its `from`, its `correlation_id` copied."""

    in_response_to: str | None = None
    to: Mapping[str, Any] | None = None
    correlation_id: str | None = None

    @classmethod
    def answering(cls, opened: Opened) -> ReplyRecipe:
        correlation_id = opened.envelope.get("correlation_id")
        sender = opened.sender
        return cls(
            in_response_to=opened.message_id,
            to={key: value for key, value in sender.items()} if sender is not None else None,
            correlation_id=correlation_id if isinstance(correlation_id, str) else None,
        )


def sent_at_ms(opened: Opened) -> int:
    """Unix ms of an opened Envelope's `sent_at` (RFC 3339, already checked by the Envelope
    rules): when its sender says it was sent, which a replay check compares with now."""
    return timestamp_ms(str(opened.envelope["sent_at"]))


def timestamp_ms(timestamp: str) -> int:
    """Unix ms of an RFC 3339 time the Envelope rules already checked (`sent_at`)."""
    return int(datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000)


def unix_ms_of(timestamp: str) -> int | None:
    """Unix ms of an RFC 3339 time a payload carries, exactly (None: one Python cannot
    read, e.g. 9 fraction digits, or one without a zone)."""
    try:
        moment = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


def without_none(value: Any) -> dict[str, Any]:
    """A struct as AIP writes objects: an absent member omitted."""
    return {key: item for key, item in msgspec.to_builtins(value).items() if item is not None}


def extension_of(envelope: Mapping[str, Any]) -> dict[str, Any]:
    """`extensions[EXTENSION_KEY]` of `envelope`; EnvelopeRejected if it is not an object."""
    extensions = envelope.get("extensions")
    if extensions is None:
        return {}
    if not isinstance(extensions, Mapping):
        raise EnvelopeRejected(ErrorCode.SCHEMA_ENVELOPE_INVALID, "extensions is not an object")
    ours = extensions.get(EXTENSION_KEY)
    if ours is None:
        return {}
    if not isinstance(ours, dict):
        raise EnvelopeRejected(
            ErrorCode.SCHEMA_ENVELOPE_INVALID, f"extensions.{EXTENSION_KEY} is not an object"
        )
    return ours


def seal(
    message_type: str,
    payload: Mapping[str, Any],
    *,
    sender: Mapping[str, Any],
    signer: AipSigner | None,
    to: Mapping[str, Any] | None = None,
    correlation_id: str | None = None,
    in_response_to: str | None = None,
    session_id: str | None = None,
    idempotency_key: str | None = None,
    extension: Mapping[str, Any] | None = None,
    trace: Mapping[str, Any] | None = None,
    message_id: str | None = None,
    sent_at: str | None = None,
) -> bytes:
    """The wire bytes (canonical JSON) of one Envelope carrying `payload`, already in
    upstream's serialized form (no `null` for an absent optional). Signed by `signer` as
    `sender` when a signer is given; else `from` is `sender` and there is no signature
    (development only: a consumer decides whether it accepts that).

    AipWireError if the frame or the payload cannot travel (a program error, not input)."""
    envelope: dict[str, Any] = {
        "aip_version": AIP_VERSION,
        "message_type": message_type,
        "message_id": message_id or new_message_id(),
        "sent_at": sent_at or now_timestamp(),
        "body": {BODY_KEYS[message_type]: dict(payload)},
    }
    if trace is None and message_id is None:
        # A message sealed with a fresh id carries its sealing span's context; one whose id
        # is derived from its content (Actions, chunks, channel messages, escalations) must
        # seal to the same bytes every time (dedupe, the chunk chain), so it carries none.
        trace = sealing_trace()
    optional = {
        "correlation_id": correlation_id,
        "in_response_to": in_response_to,
        "session_id": session_id,
        "idempotency_key": idempotency_key,
        "to": to,
        "trace": trace,
    }
    envelope.update({name: value for name, value in optional.items() if value is not None})
    if extension:
        envelope["extensions"] = {EXTENSION_KEY: dict(extension)}
    if signer is None:
        envelope["from"] = dict(sender)
        check_envelope(envelope)
        return canonical_bytes(envelope)
    return signed_bytes(envelope, signer, sender)


def sealing_trace() -> dict[str, str] | None:
    """The W3C trace context of the span that seals a message (`traceparent`, `tracestate`),
    for `Envelope.trace`: the signed copy of what the NATS headers carry (those name the
    publish span, a child of this one, in the same trace). None when tracing is off or no
    span is current, so the Envelope then has no `trace` and costs nothing more."""
    carrier: dict[str, str] = {}
    tracing.inject(carrier)
    return carrier or None


def open_envelope(
    data: bytes,
    *,
    message_types: frozenset[str],
    max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES,
    verify: bool = True,
) -> Opened:
    """Parse and check one received Envelope of one of `message_types`, and verify its
    signature when it carries one (which keys to trust is the caller's decision: it reads
    `Opened.verified.did`). Bytes over `max_bytes` are refused before they are parsed.

    EnvelopeRejected: `envelope.decode.invalid` for bytes that are not one JSON object
    (oversized, invalid UTF-8 or JSON, a repeated key, too deep), `schema.envelope.invalid`
    for a frame that breaks the Envelope rules or is of another message type, and
    `connector_host.authentication` for a signature that is present but does not verify.

    `verify=False` skips the signature (`verified` stays None) for bytes read back from the
    workers' own store, which a worker signed when it wrote them: the ~50 µs Ed25519 check
    would be repeated on every settle."""
    if len(data) > max_bytes:
        raise EnvelopeRejected(
            ErrorCode.ENVELOPE_DECODE_INVALID,
            f"envelope is {len(data)} bytes, over the {max_bytes}-byte limit",
        )
    try:
        envelope = loads(data)
    except MalformedJson as exc:
        raise EnvelopeRejected(ErrorCode.ENVELOPE_DECODE_INVALID, str(exc)) from None
    try:
        check_envelope(envelope)
    except AipWireError as exc:
        raise EnvelopeRejected(ErrorCode.SCHEMA_ENVELOPE_INVALID, str(exc)) from None
    message_type = envelope["message_type"]
    if message_type not in message_types:
        wanted = ", ".join(sorted(message_types))
        raise EnvelopeRejected(
            ErrorCode.SCHEMA_ENVELOPE_INVALID,
            f"message_type {message_type} is not taken here (expected {wanted})",
        )
    payload = envelope["body"][BODY_KEYS[message_type]]
    security = envelope.get("security")
    if security is not None and not isinstance(security, Mapping):
        raise EnvelopeRejected(ErrorCode.SCHEMA_ENVELOPE_INVALID, "security is not an object")
    verified: VerifiedEnvelope | None = None
    if verify and security is not None and security.get("signature") is not None:
        try:
            # A copy (as verify_envelope holds); the Envelope rules were checked above.
            verified = verify_checked(dict(envelope))
        except SignatureError as exc:
            raise EnvelopeRejected(ErrorCode.HOST_AUTHENTICATION, str(exc)) from None
        except AipWireError as exc:
            raise EnvelopeRejected(ErrorCode.SCHEMA_ENVELOPE_INVALID, str(exc)) from None
    return Opened(envelope=envelope, payload=payload, verified=verified)


def invalid(reason: str) -> EnvelopeRejected:
    """The refusal of a frame, body or extension our rules or AIP's do not take."""
    return EnvelopeRejected(ErrorCode.SCHEMA_ENVELOPE_INVALID, reason)


def open_payload(opened: Opened, message_type: str) -> AipStruct:
    """The body of an opened Envelope decoded into its closed AIP type. A signed body must
    also be in the form upstream re-serializes (`open_signed_body`): one with a `null` for
    an absent optional or a written empty list would verify here and fail at every
    upstream verifier. EnvelopeRejected (`schema.envelope.invalid`) otherwise."""
    opener = open_body if opened.verified is None else open_signed_body
    try:
        return opener(message_type, opened.envelope["body"])
    except BodyError as exc:
        raise invalid(str(exc)) from None


def extension_as(opened: Opened, extension_type: type[T]) -> T:
    """Our extension object of an opened Envelope as its closed type (an absent one reads
    as `{}`); EnvelopeRejected (`schema.envelope.invalid`) for one that does not fit."""
    try:
        return msgspec.convert(opened.extension, extension_type, strict=True)
    except msgspec.ValidationError as exc:
        raise invalid(f"extensions: {exc}") from None


__all__ = [
    "DEFAULT_MAX_ENVELOPE_BYTES",
    "EXTENSION_KEY",
    "Opened",
    "ReplyRecipe",
    "extension_of",
    "new_message_id",
    "open_envelope",
    "open_payload",
    "seal",
    "sent_at_ms",
]
