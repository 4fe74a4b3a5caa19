"""The AIP 1.0 Envelope as the reference implementation reads and re-serializes it.

Upstream verifies a signature over its own re-serialization of the *decoded, typed*
Envelope (`aip-crypto::envelope_signing_bytes`), not over the received bytes. So what is
signed is the Envelope as the Rust types print it, and this module reproduces that for the
parts whose types are fixed here, the Envelope itself and its `from`/`to` Principals
(`aip-core` `envelope.rs`, `model.rs`):

* an optional field that is absent or `null` is omitted (serde `skip_serializing_if`);
  `trace`, `security` and `extensions` are free JSON, but `null` there reads as absent too;
* a Principal's empty `external_refs` / `delegated_authority` lists are omitted;
* `sent_at` (and a grant's `expires_at`) re-renders as the `time` crate writes RFC 3339:
  a zero offset as `Z`, fractional seconds only when non-zero, trailing zeros trimmed.

The body (`body.action`, …) is taken as given: its typing is the schema layer's job, so a
signer must hand in a body already in upstream's serialized form (no `null` for an absent
optional, defaulted booleans written). Free values inside it (`input`, `data`, …) keep their
nulls, as serde_json's `Value` does.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from schemas.aip.messages import BODY_KEYS as MESSAGE_BODY_KEYS
from worker.aip.errors import MalformedEnvelope

AIP_VERSION: Final = "1.0"

#: message_type → the one key of `body` (upstream `MessageType` / `MessageBody`).
BODY_KEYS: Final[Mapping[str, str]] = MESSAGE_BODY_KEYS

REQUIRED_FIELDS: Final = ("aip_version", "message_type", "message_id", "sent_at", "body")
_OPTIONAL_STRINGS: Final = ("session_id", "correlation_id", "in_response_to", "idempotency_key")
_PRINCIPALS: Final = ("from", "to")
_FREE_FIELDS: Final = ("trace", "security", "extensions")
FIELDS: Final = frozenset(REQUIRED_FIELDS + _OPTIONAL_STRINGS + _PRINCIPALS + _FREE_FIELDS)

PRINCIPAL_KINDS: Final = frozenset(
    {"human", "agent", "service", "tenant", "customer", "contact", "system"}
)
_PRINCIPAL_OPTIONAL: Final = ("display_name", "trust_domain", "did")
_PRINCIPAL_FIELDS: Final = frozenset(
    {"id", "kind", "external_refs", "delegated_authority", "auth_context", *_PRINCIPAL_OPTIONAL}
)

# RFC 3339 date-time (upper-case T and Z, 1-9 fraction digits: the `time` crate keeps
# nanoseconds, and how it treats a tenth digit is not established, so it is refused);
# leap seconds are refused too.
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})",
    re.ASCII,  # ASCII digits only: int() would also take other scripts' digits
)


def rfc3339_canonical(text: str, *, what: str = "sent_at") -> str:
    """`text` re-rendered as upstream's `time` crate writes it; MalformedEnvelope if it is
    not an RFC 3339 date-time. The offset is kept (upstream keeps it), `+00:00` and
    `-00:00` become `Z`, the fraction loses its trailing zeros."""
    if not isinstance(text, str):
        raise MalformedEnvelope(f"{what} is not an RFC 3339 date-time")
    return _rfc3339_canonical(text, what)


@functools.lru_cache(maxsize=512)  # checking and signing one Envelope both read its sent_at
def _rfc3339_canonical(text: str, what: str) -> str:
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise MalformedEnvelope(f"{what} is not an RFC 3339 date-time")
    year, month, day, hour, minute, second = (int(part) for part in match.group(*range(1, 7)))
    fraction, offset = match.group(7), match.group(8)
    try:
        datetime(year, month, day, hour, minute, second)  # calendar check
    except ValueError:
        raise MalformedEnvelope(f"{what} is not a valid date and time") from None
    if offset != "Z":
        hours, minutes = int(offset[1:3]), int(offset[4:6])
        if hours > 23 or minutes > 59:
            raise MalformedEnvelope(f"{what} has an invalid UTC offset")
        if hours == 0 and minutes == 0:
            offset = "Z"
    nanos = (fraction or "").ljust(9, "0")
    digits = nanos.rstrip("0")
    head = f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}"
    return f"{head}.{digits}{offset}" if digits else f"{head}{offset}"


def format_timestamp(moment: datetime) -> str:
    """An aware datetime as the UTC RFC 3339 text a signer writes (`…Z`, trimmed fraction)."""
    if moment.tzinfo is None:
        raise ValueError("a naive datetime has no defined instant")
    utc = moment.astimezone(UTC)
    text = utc.strftime("%Y-%m-%dT%H:%M:%S")
    micros = f"{utc.microsecond:06d}".rstrip("0")
    return f"{text}.{micros}Z" if micros else f"{text}Z"


def now_timestamp() -> str:
    return format_timestamp(datetime.now(UTC))


def check_envelope(envelope: Any) -> None:
    """The Envelope's own rules (upstream `validate_envelope`, and a closed top level):
    known fields only, `aip_version` "1.0", a registered `message_type` whose body key is
    the body's one key, a non-empty `message_id`, an RFC 3339 `sent_at`, a non-empty
    `idempotency_key` when present, and Principals with `id` and a known `kind`."""
    if not isinstance(envelope, Mapping):
        raise MalformedEnvelope("an Envelope is a JSON object")
    unknown = sorted(set(envelope) - FIELDS)
    if unknown:
        raise MalformedEnvelope(f"unknown Envelope field {unknown[0]!r}")
    for name in REQUIRED_FIELDS:
        if envelope.get(name) is None:
            raise MalformedEnvelope(f"the Envelope has no {name}")
    if envelope["aip_version"] != AIP_VERSION:
        raise MalformedEnvelope('aip_version is not "1.0"')
    message_type = envelope["message_type"]
    body_key = BODY_KEYS.get(message_type) if isinstance(message_type, str) else None
    if body_key is None:
        raise MalformedEnvelope("message_type is not a registered AIP 1.0 message type")
    body = envelope["body"]
    if not isinstance(body, Mapping) or len(body) != 1:
        raise MalformedEnvelope("body is an object with exactly one key")
    if body_key not in body:
        raise MalformedEnvelope(f"message_type {message_type} needs body key {body_key!r}")
    if not isinstance(body[body_key], Mapping):
        raise MalformedEnvelope(f"body.{body_key} is an object")  # every payload is a struct
    if not isinstance(envelope["message_id"], str) or not envelope["message_id"]:
        raise MalformedEnvelope("message_id is a non-empty string")
    rfc3339_canonical(envelope["sent_at"])
    for name in _OPTIONAL_STRINGS:
        value = envelope.get(name)
        if value is not None and not isinstance(value, str):
            raise MalformedEnvelope(f"{name} is a string")
    if envelope.get("idempotency_key") == "":
        raise MalformedEnvelope("idempotency_key must be non-empty if present")
    for name in _PRINCIPALS:
        if envelope.get(name) is not None:
            _check_principal(envelope[name], name)


def _check_principal(principal: Any, where: str) -> None:
    if not isinstance(principal, Mapping):
        raise MalformedEnvelope(f"{where} is a Principal object")
    unknown = sorted(set(principal) - _PRINCIPAL_FIELDS)
    if unknown:
        raise MalformedEnvelope(f"unknown {where} field {unknown[0]!r}")
    if not isinstance(principal.get("id"), str) or not principal["id"]:
        raise MalformedEnvelope(f"{where}.id is a non-empty string")
    if principal.get("kind") not in PRINCIPAL_KINDS:
        raise MalformedEnvelope(f"{where}.kind is not a Principal kind")
    for name in _PRINCIPAL_OPTIONAL:
        value = principal.get(name)
        if value is not None and not isinstance(value, str):
            raise MalformedEnvelope(f"{where}.{name} is a string")
    for name in ("external_refs", "delegated_authority"):
        value = principal.get(name)
        if value is not None and not isinstance(value, list):
            raise MalformedEnvelope(f"{where}.{name} is an array")
    for grant in principal.get("delegated_authority") or ():
        if not isinstance(grant, Mapping):
            raise MalformedEnvelope(f"{where}.delegated_authority holds objects")
        if grant.get("expires_at") is not None:
            rfc3339_canonical(grant["expires_at"], what=f"{where} grant expires_at")


def typed_form(envelope: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a checked Envelope as upstream's types re-serialize it (module docstring)."""
    out: dict[str, Any] = {}
    for name, value in envelope.items():
        if value is None:
            continue
        if name == "sent_at":
            value = rfc3339_canonical(value)
        elif name in _PRINCIPALS:
            value = _typed_principal(value)
        out[name] = value
    return out


def _typed_principal(principal: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in principal.items():
        if value is None or (name in ("external_refs", "delegated_authority") and not value):
            continue
        if name == "delegated_authority":
            value = [_typed_grant(grant) for grant in value]
        out[name] = value
    return out


def _typed_grant(grant: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in grant.items():
        if value is None or (name == "scopes" and not value):
            continue
        if name == "expires_at":
            value = rfc3339_canonical(value, what="grant expires_at")
        out[name] = value
    return out


def untyped_differences(envelope: Mapping[str, Any]) -> list[str]:
    """Where `envelope` differs from its typed form: what a signer must not hand in, since a
    verifier would sign other bytes than the ones it sent (`null`s, empty lists, a
    non-canonical timestamp)."""
    typed = typed_form(envelope)
    differences = [name for name in envelope if name not in typed]
    differences += [name for name in typed if typed[name] != envelope[name]]
    return sorted(differences)
